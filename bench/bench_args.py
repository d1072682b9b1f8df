"""Argument parsing shared by the benchmark scripts."""
import argparse


def positive_int_list(text):
    """'100,1000,10000' -> [100, 1000, 10000]; argparse error unless all are positive ints."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}': expected positive whole numbers like 100,1000")
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"'{text}': values must be positive")
    return values
