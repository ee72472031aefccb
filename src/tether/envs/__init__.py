"""tether.envs"""
