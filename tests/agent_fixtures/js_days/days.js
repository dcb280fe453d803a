// Days in a month; month is 1-12.
function isLeap(year) {
  return (year % 4 === 0 && year % 100 !== 0) || year % 400 === 0;
}

function daysInMonth(year, month) {
  const days = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
  if (month === 2 && isLeap(year)) {
    return 29;
  }
  return days[month];
}

module.exports = { isLeap, daysInMonth };
