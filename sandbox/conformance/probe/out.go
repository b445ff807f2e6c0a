package main

import (
	"errors"
	"os"
	"strconv"
	"syscall"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// obj is a JSON object whose fields keep the order they were added in. The
// probe writes its JSON by hand: encoding/json would make the binary a third
// larger, and the probe travels inside every ExecRequest of the suite.
type obj []field

type field struct {
	k string
	v any
}

// emit writes o as one line of JSON on stdout.
func emit(o obj) {
	b := appendJSON(nil, o)
	b = append(b, '\n')
	writeAll(1, b)
}

// writeAll writes b to fd, retrying short writes, and gives up silently on
// an error: the probe reports, it never fails because its reader went away.
func writeAll(fd int, b []byte) {
	for len(b) > 0 {
		n, err := syscall.Write(fd, b)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || n <= 0 {
			return
		}
		b = b[n:]
	}
}

func appendJSON(b []byte, v any) []byte {
	switch v := v.(type) {
	case nil:
		return append(b, "null"...)
	case string:
		return appendQuoted(b, v)
	case bool:
		return strconv.AppendBool(b, v)
	case int:
		return strconv.AppendInt(b, int64(v), 10)
	case int64:
		return strconv.AppendInt(b, v, 10)
	case uint64:
		return strconv.AppendUint(b, v, 10)
	case []string:
		b = append(b, '[')
		for i, s := range v {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendQuoted(b, s)
		}
		return append(b, ']')
	case []int:
		b = append(b, '[')
		for i, n := range v {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, int64(n), 10)
		}
		return append(b, ']')
	case obj:
		b = append(b, '{')
		for i, f := range v {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendQuoted(b, f.k)
			b = append(b, ':')
			b = appendJSON(b, f.v)
		}
		return append(b, '}')
	case []obj:
		b = append(b, '[')
		for i, o := range v {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSON(b, o)
		}
		return append(b, ']')
	}
	return appendQuoted(b, "unsupported value")
}

// appendQuoted appends s as a JSON string. Invalid UTF-8 becomes U+FFFD.
func appendQuoted(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b = append(b, '\\', byte(r))
		case r < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[r>>4], hex[r&0xf])
		default:
			b = utf8.AppendRune(b, r)
		}
	}
	return append(b, '"')
}

// errnoOf extracts the errno from err: 0 for nil, EIO for an error that
// carries none.
func errnoOf(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return syscall.EIO
}

// errf is the pair of fields every attempt reports: "errno" (0 for success)
// and "err", its symbolic name.
func errf(e syscall.Errno) []field {
	name := ""
	if e != 0 {
		name = unix.ErrnoName(e)
		if name == "" {
			name = "errno " + strconv.Itoa(int(e))
		}
	}
	return []field{{"errno", int(e)}, {"err", name}}
}

func attempt(err error) []field { return errf(errnoOf(err)) }

func fail(msg string) {
	writeAll(2, []byte("probe: "+msg+"\n"))
	os.Exit(2)
}
