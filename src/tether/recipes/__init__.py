"""tether.recipes"""
