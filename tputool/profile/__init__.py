"""tputool.profile"""
