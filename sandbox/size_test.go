package sandbox

import (
	"strings"
	"testing"
)

func TestParseSize(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		bad  bool
	}{
		{in: "256MiB", want: 256 << 20},
		{in: "1GiB", want: 1 << 30},
		{in: "64M", want: 64 << 20},
		{in: "64MB", want: 64 << 20},
		{in: "4KiB", want: 4 << 10},
		{in: "1048576", want: 1 << 20},
		{in: "12B", want: 12},
		{in: "-1MiB", bad: true},
		{in: "1.5GiB", bad: true},
		{in: "lots", bad: true},
		{in: "99999999999GiB", bad: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseSize(tt.in)
			if tt.bad {
				if err == nil {
					t.Errorf("got %d, want an error", got)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("got %d, %v, want %d", got, err, tt.want)
			}
		})
	}
}

func TestFormatSize(t *testing.T) {
	for n, want := range map[int64]string{-1: "unknown", 0: "0 bytes", 1000: "1000 bytes", 64 << 10: "64 KiB", 512 << 20: "512 MiB", 2 << 30: "2 GiB", 1536 << 10: "1536 KiB"} {
		if got := FormatSize(n); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", n, got, want)
		}
		if n >= 0 {
			if back, err := ParseSize(strings.ReplaceAll(strings.TrimSuffix(FormatSize(n), " bytes"), " ", "")); err != nil || back != n {
				t.Errorf("ParseSize(FormatSize(%d)) = %d, %v", n, back, err)
			}
		}
	}
}
