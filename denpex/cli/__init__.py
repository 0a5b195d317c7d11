"""denpex.cli"""
