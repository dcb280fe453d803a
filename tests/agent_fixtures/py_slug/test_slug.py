import unittest

from slug import slugify


class SlugTest(unittest.TestCase):
    def test_words_are_joined_with_dashes(self):
        self.assertEqual(slugify("Hello, World!"), "hello-world")

    def test_digits_stay(self):
        self.assertEqual(slugify("Top 10 tips"), "top-10-tips")

    def test_empty(self):
        self.assertEqual(slugify("  "), "")


if __name__ == "__main__":
    unittest.main()
