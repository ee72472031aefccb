"""tether.eval"""
