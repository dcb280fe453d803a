const test = require("node:test");
const assert = require("node:assert");
const { isLeap, daysInMonth } = require("./days.js");

test("leap years", () => {
  assert.strictEqual(isLeap(2024), true);
  assert.strictEqual(isLeap(1900), false);
});

test("days in a month", () => {
  assert.strictEqual(daysInMonth(2023, 1), 31);
  assert.strictEqual(daysInMonth(2023, 4), 30);
  assert.strictEqual(daysInMonth(2024, 2), 29);
  assert.strictEqual(daysInMonth(2023, 12), 31);
});
