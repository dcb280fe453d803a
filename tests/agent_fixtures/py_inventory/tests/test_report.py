from inventory.report import heaviest_first
from inventory.stock import Item


def test_heaviest_first():
    items = [Item("tea", 250, 4.0), Item("rice", 2000, 3.5), Item("salt", 1000, 0.9)]
    assert heaviest_first(items) == [("rice", 2.0), ("salt", 1.0), ("tea", 0.25)]


def test_nothing():
    assert heaviest_first([]) == []
