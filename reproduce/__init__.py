"""reproduce: regenerate Tables 2, 3 and 4 of "Attention Is All You Need" (Vaswani et al., 2017)."""

__version__ = "0.1.0"
