package sandbox

import (
	"testing"
	"time"
)

func TestParseSize(t *testing.T) {
	tests := []struct {
		in   string
		want int64
	}{
		{"256MiB", 256 << 20},
		{"512m", 512 << 20},
		{"512M", 512 << 20},
		{"512mb", 512 << 20},
		{"512 MiB", 512 << 20},
		{"1GiB", 1 << 30},
		{"1g", 1 << 30},
		{"1.5GiB", 3 << 29},
		{"64MB", 64 << 20},
		{"4KiB", 4 << 10},
		{"4k", 4 << 10},
		{"2TiB", 2 << 40},
		{"1048576", 1 << 20},
		{"12B", 12},
		{"1000 bytes", 1000},
		{"0", 0},
		{" 64m ", 64 << 20},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			if got, err := ParseSize(tt.in); err != nil || got != tt.want {
				t.Errorf("got %d, %v, want %d", got, err, tt.want)
			}
		})
	}
	for _, in := range []string{"", "-1MiB", "lots", "MiB", "1.2.3M", "1e3", "1 MiB B", "0.3B", "5 apples", "1PiB", "99999999999GiB", "1,5GiB"} {
		t.Run("refused "+in, func(t *testing.T) {
			if got, err := ParseSize(in); err == nil {
				t.Errorf("got %d, want an error", got)
			}
		})
	}
}

func TestFormatSize(t *testing.T) {
	for n, want := range map[int64]string{-1: "unknown", 0: "0B", 1000: "1000B", 64 << 10: "64KiB", 512 << 20: "512MiB", 2 << 30: "2GiB", 1536 << 10: "1536KiB", 3 << 40: "3TiB"} {
		if got := FormatSize(n); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", n, got, want)
		}
		if n >= 0 {
			if back, err := ParseSize(FormatSize(n)); err != nil || back != n {
				t.Errorf("ParseSize(FormatSize(%d)) = %d, %v", n, back, err)
			}
		}
	}
}

func TestParseDuration(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
	}{
		{"30s", 30 * time.Second},
		{"2m", 2 * time.Minute},
		{"1m30s", 90 * time.Second},
		{"1h 30m", 90 * time.Minute},
		{"1.5h", 90 * time.Minute},
		{"500ms", 500 * time.Millisecond},
		{"10 seconds", 10 * time.Second},
		{"2 min", 2 * time.Minute},
		{"1 hour", time.Hour},
		{"30S", 30 * time.Second},
		{"0", 0},
		{"0s", 0},
		{" 5s ", 5 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			if got, err := ParseDuration(tt.in); err != nil || got != tt.want {
				t.Errorf("got %v, %v, want %v", got, err, tt.want)
			}
		})
	}
	for _, in := range []string{"", "30", "-1s", "soon", "1y", "1 fortnight", "s", "1.s", "30s later", "9999999999h"} {
		t.Run("refused "+in, func(t *testing.T) {
			if got, err := ParseDuration(in); err == nil {
				t.Errorf("got %v, want an error", got)
			}
		})
	}
}

func TestFormatDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{0: "0s", 30 * time.Second: "30s", 2 * time.Minute: "2m", time.Hour: "1h",
		90 * time.Second: "1m30s", 90 * time.Minute: "1h30m", time.Hour + 30*time.Second: "1h0m30s", 500 * time.Millisecond: "500ms", 10 * time.Minute: "10m"} {
		if got := FormatDuration(d); got != want {
			t.Errorf("FormatDuration(%v) = %q, want %q", d, got, want)
		}
		if back, err := ParseDuration(FormatDuration(d)); err != nil || back != d {
			t.Errorf("ParseDuration(FormatDuration(%v)) = %v, %v", d, back, err)
		}
	}
}
