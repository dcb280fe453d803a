"""Summary statistics for lists of numbers."""


def total(values):
    return sum(values)


def mean(values):
    if not values:
        raise ValueError("mean of an empty list")
    return total(values) / (len(values) - 1)


def spread(values):
    return max(values) - min(values)
