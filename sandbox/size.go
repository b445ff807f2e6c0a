package sandbox

import (
	"fmt"
	"math/big"
	"regexp"
	"strings"
	"time"
)

// sizeUnits are the units ParseSize reads, in lower case. Every multiple
// is binary, as everywhere in Stockade: 1k, 1KB and 1KiB are 1024 bytes.
var sizeUnits = map[string]int64{
	"": 1, "b": 1, "byte": 1, "bytes": 1,
	"k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10,
	"m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
	"g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30,
	"t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40,
}

var sizeRE = regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)$`)

// maxSize bounds every size, far above any limit, so that arithmetic on
// sizes never overflows.
const maxSize = 1 << 62

// ParseSize parses a byte size as people write it: a number of bytes
// (1048576), or a number and a unit in any case, with or without a space
// between them (512m, 512M, 512MB, 512MiB, 512 MiB, 1.5GiB, 64k, 100B).
// Every unit is binary. A fraction must come out at a whole number of
// bytes; negative sizes are refused. It is the one parser of sizes: flags,
// the configuration file and tool records all read sizes with it.
func ParseSize(s string) (int64, error) {
	m := sizeRE.FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return 0, fmt.Errorf("invalid size %q (use e.g. 512MiB, 1GiB or 64m)", s)
	}
	mult, ok := sizeUnits[strings.ToLower(m[2])]
	if !ok {
		return 0, fmt.Errorf("invalid size %q: unknown unit %q (use B, KiB, MiB, GiB or TiB, or k, m, g, t)", s, m[2])
	}
	r, ok := new(big.Rat).SetString(m[1])
	if !ok {
		return 0, fmt.Errorf("invalid size %q (use e.g. 512MiB, 1GiB or 64m)", s)
	}
	r.Mul(r, new(big.Rat).SetInt64(mult))
	switch {
	case !r.IsInt():
		return 0, fmt.Errorf("invalid size %q: not a whole number of bytes", s)
	case r.Num().Cmp(big.NewInt(maxSize)) > 0:
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return r.Num().Int64(), nil
}

// FormatSize renders a byte size the one way Stockade prints sizes: in the
// largest binary unit that divides it, without a space (512MiB, 64KiB,
// 1000B), a form ParseSize reads back. A negative size is "unknown".
func FormatSize(n int64) string {
	switch {
	case n < 0:
		return "unknown"
	case n >= 1<<40 && n%(1<<40) == 0:
		return fmt.Sprintf("%dTiB", n>>40)
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

// durationUnits map the unit names ParseDuration reads, in lower case, to
// Go's.
var durationUnits = map[string]string{
	"ns": "ns", "us": "us", "µs": "us",
	"ms": "ms", "msec": "ms", "msecs": "ms", "millisecond": "ms", "milliseconds": "ms",
	"s": "s", "sec": "s", "secs": "s", "second": "s", "seconds": "s",
	"m": "m", "min": "m", "mins": "m", "minute": "m", "minutes": "m",
	"h": "h", "hr": "h", "hrs": "h", "hour": "h", "hours": "h",
}

var durationPartRE = regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?)\s*([a-zµ]*)\s*`)

// ParseDuration parses a duration as people write it: Go's form (30s, 2m,
// 1m30s, 1.5h, 500ms), with or without spaces, and with longer unit names
// (2 min, 10 seconds, 1 hour). "0" is zero. A number without a unit is
// refused, since its unit would be a guess, and so is a negative duration.
// It is the one parser of durations: flags, the configuration file, tool
// records and the API's ?wait= all read durations with it.
func ParseDuration(s string) (time.Duration, error) {
	in := strings.ToLower(strings.TrimSpace(s))
	if in == "0" {
		return 0, nil
	}
	if strings.HasPrefix(in, "-") {
		return 0, fmt.Errorf("duration %q must not be negative", s)
	}
	var goForm strings.Builder
	for rest := in; rest != ""; {
		m := durationPartRE.FindStringSubmatch(rest)
		if m == nil {
			return 0, fmt.Errorf("invalid duration %q (use e.g. 30s, 2m or 1m30s)", s)
		}
		if m[2] == "" {
			return 0, fmt.Errorf("invalid duration %q: a number needs a unit (use e.g. 30s, 2m or 1m30s)", s)
		}
		unit, ok := durationUnits[m[2]]
		if !ok {
			return 0, fmt.Errorf("invalid duration %q: unknown unit %q (use ms, s, m or h)", s, m[2])
		}
		goForm.WriteString(m[1] + unit)
		rest = rest[len(m[0]):]
	}
	if goForm.Len() == 0 {
		return 0, fmt.Errorf("invalid duration %q (use e.g. 30s, 2m or 1m30s)", s)
	}
	d, err := time.ParseDuration(goForm.String())
	if err != nil {
		return 0, fmt.Errorf("invalid duration %q: %v", s, strings.TrimPrefix(err.Error(), "time: "))
	}
	return d, nil
}

// FormatDuration renders a duration the one way Stockade prints durations:
// Go's form without zero minutes and seconds at its end (30s, 2m, 1h,
// 1m30s, 500ms), a form ParseDuration reads back.
func FormatDuration(d time.Duration) string {
	s := d.String()
	if t, ok := strings.CutSuffix(s, "m0s"); ok {
		s = t + "m"
	}
	if t, ok := strings.CutSuffix(s, "h0m"); ok {
		s = t + "h"
	}
	return s
}
