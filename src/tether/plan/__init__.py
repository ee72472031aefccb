"""tether.plan"""
