from inventory.units import kilograms


def heaviest_first(items):
    """Names and weights in kg, heaviest item first."""
    ordered = sorted(items, key=lambda item: item.grams)
    return [(item.name, kilograms(item.grams)) for item in ordered]
