"""tether.health"""
