"""Types of the compiled core (python/native, built by maturin)."""

from typing import List, Tuple

def parse_limits(text: str) -> List[Tuple[float, float, float]]: ...
