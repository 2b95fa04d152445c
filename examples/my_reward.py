"""A reward function as verl users write one: ``compute_score(data_source, solution_str,
ground_truth, extra_info)`` returning a float, or a dict whose ``"score"`` is the reward.
Named in the config as ``task.reward = "my_reward:compute_score"``."""


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    out = solution_str.strip()
    hits = sum(a == b for a, b in zip(out, ground_truth, strict=False))
    return {"score": hits / max(len(out), len(ground_truth), 1), "exact": float(out == ground_truth)}
