from dataclasses import dataclass


@dataclass
class Item:
    name: str
    grams: int
    price: float
