package supervisor

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"syscall"

	"github.com/stockade-sh/stockade/errdefs"
)

// CheckPrivate returns p's information if p, not followed if it is a
// symbolic link, is a directory (dir) or a regular file (!dir) owned by
// this process's effective user that no one else may read, write or
// search (mode&077 == 0). Anything else is ErrFailedPrecondition: a path
// another user could have made, or could change, is not this process's to
// trust.
func CheckPrivate(p string, dir bool) (os.FileInfo, error) {
	fi, err := os.Lstat(p)
	if err != nil {
		return nil, err
	}
	return fi, checkPrivateInfo(p, fi, dir)
}

func checkPrivateInfo(p string, fi os.FileInfo, dir bool) error {
	want := "a regular file"
	if dir {
		want = "a directory"
	}
	switch {
	case fi.Mode()&os.ModeSymlink != 0:
		return fmt.Errorf("%s is a symbolic link, not %s: %w", p, want, errdefs.ErrFailedPrecondition)
	case dir && !fi.IsDir(), !dir && !fi.Mode().IsRegular():
		return fmt.Errorf("%s is not %s: %w", p, want, errdefs.ErrFailedPrecondition)
	case fi.Mode().Perm()&0o077 != 0:
		return fmt.Errorf("%s is open to other users (mode %o); make it 0%o or remove it: %w", p, fi.Mode().Perm(), fi.Mode().Perm()&0o700, errdefs.ErrFailedPrecondition)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || int(st.Uid) != os.Geteuid() {
		uid := -1
		if ok {
			uid = int(st.Uid)
		}
		return fmt.Errorf("%s is owned by uid %d, not %d; remove it: %w", p, uid, os.Geteuid(), errdefs.ErrFailedPrecondition)
	}
	return nil
}

// OpenPrivate opens the regular file p for reading without following a
// symbolic link, and checks the file it opened as CheckPrivate does.
func OpenPrivate(p string) (*os.File, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if errors.Is(err, syscall.ELOOP) {
		return nil, fmt.Errorf("%s is a symbolic link, not a regular file: %w", p, errdefs.ErrFailedPrecondition)
	}
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err == nil {
		err = checkPrivateInfo(p, fi, false)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// ReadPrivate reads at most max bytes of the file p, opened by
// OpenPrivate.
func ReadPrivate(p string, max int64) ([]byte, error) {
	f, err := OpenPrivate(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readAtMost(f, max)
}

// MAC returns the hex HMAC-SHA256 of data under key (the shims' key,
// LoadKey): what a record this key's holder wrote carries.
func MAC(key, data []byte) string {
	h := hmac.New(sha256.New, key)
	h.Write(data)
	return hex.EncodeToString(h.Sum(nil))
}

// CheckMAC reports whether mac is data's MAC under key.
func CheckMAC(key, data []byte, mac string) bool {
	return hmac.Equal([]byte(mac), []byte(MAC(key, data)))
}
