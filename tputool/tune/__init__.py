"""tputool.tune"""
