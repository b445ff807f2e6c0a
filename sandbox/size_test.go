package sandbox

import "testing"

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
