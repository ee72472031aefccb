"""Packaged YAML configs (the demo default lives here so that an installed tether can run it)."""
