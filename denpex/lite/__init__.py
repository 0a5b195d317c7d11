"""denpex.lite"""
