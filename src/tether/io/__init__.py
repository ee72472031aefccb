"""tether.io"""
