"""(map to be written)"""
