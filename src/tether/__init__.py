"""tether: reinforcement fine-tuning of LLMs and LLM agents."""
__version__ = "0.1.0"
