package config

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// sizeUnits maps a lower-cased unit suffix to its multiplier.
var sizeUnits = map[string]float64{
	"":    1,
	"b":   1,
	"kb":  1e3,
	"mb":  1e6,
	"gb":  1e9,
	"tb":  1e12,
	"kib": 1 << 10,
	"mib": 1 << 20,
	"gib": 1 << 30,
	"tib": 1 << 40,
}

// ParseSize parses a byte size: a non-negative number, optionally with a
// decimal (KB, MB, GB, TB) or binary (KiB, MiB, GiB, TiB) unit, case
// insensitive, e.g. "8GiB", "20MB", "1000000", "1.5GiB". The result must be a
// whole number of bytes.
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && (t[i] >= '0' && t[i] <= '9' || t[i] == '.') {
		i++
	}
	num, unit := t[:i], strings.ToLower(strings.TrimSpace(t[i:]))
	if num == "" {
		return 0, fmt.Errorf("invalid size %q: want a number of bytes, e.g. 20MB, 8GiB or 1000000", s)
	}
	mult, ok := sizeUnits[unit]
	if !ok {
		return 0, fmt.Errorf("invalid size %q: unknown unit %q (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)", s, t[i:])
	}
	if !strings.Contains(num, ".") {
		n, err := strconv.ParseInt(num, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("invalid size %q: %w", s, err)
		}
		if n > math.MaxInt64/int64(mult) {
			return 0, fmt.Errorf("invalid size %q: too large", s)
		}
		return n * int64(mult), nil
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, fmt.Errorf("invalid size %q: %w", s, err)
	}
	v := f * mult
	if v >= math.MaxInt64 {
		return 0, fmt.Errorf("invalid size %q: too large", s)
	}
	if v != math.Trunc(v) {
		return 0, fmt.Errorf("invalid size %q: not a whole number of bytes", s)
	}
	return int64(v), nil
}

// ParseDuration parses a Go duration ("200ms", "1h30m") with an optional
// leading whole number of days ("6d", "1d12h"). Negative values are refused.
func ParseDuration(s string) (time.Duration, error) {
	t := strings.TrimSpace(s)
	var days time.Duration
	if i := strings.IndexByte(t, 'd'); i >= 0 {
		n, err := strconv.ParseUint(t[:i], 10, 16)
		if err != nil {
			return 0, fmt.Errorf("invalid duration %q: days must be a whole number, e.g. 6d or 1d12h", s)
		}
		days = time.Duration(n) * 24 * time.Hour
		t = t[i+1:]
		if t == "" {
			return days, nil
		}
	}
	d, err := time.ParseDuration(t)
	if err != nil {
		return 0, fmt.Errorf("invalid duration %q: want e.g. 200ms, 30s, 1h or 6d", s)
	}
	if d < 0 {
		return 0, fmt.Errorf("invalid duration %q: negative", s)
	}
	if days > 0 && d > math.MaxInt64-days {
		return 0, fmt.Errorf("invalid duration %q: too large", s)
	}
	return days + d, nil
}
