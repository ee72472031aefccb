"""tether.policy"""
