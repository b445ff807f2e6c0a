package image

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
)

// digestFormat names the tree encoding hashed by treeDigest. It is recorded
// in every manifest; changing the encoding requires a new name.
const digestFormat = "stockade-tree-v1"

// treeSum is the result of hashing a root filesystem.
type treeSum struct {
	hex  string // lower-case hex SHA-256 of the tree encoding
	size int64  // apparent size of regular files, hard links counted once
}

// entry is one node of a tree, in walk order.
type entry struct {
	rel    string // slash-separated path relative to the root; "." for the root
	kind   byte
	perm   uint32 // permission, setuid, setgid and sticky bits
	uid    uint32
	gid    uint32
	rdev   uint64
	target string // symlink target
	size   int64
	sum    [sha256.Size]byte // content hash of a regular file
}

// treeDigest hashes the tree under dir: for every node, depth first with the
// entries of each directory sorted by name, the relative path, type, mode bits, owner, symlink target,
// device number and the SHA-256 of the content. Modification and access
// times, link counts and extended attributes are not part of the digest, so
// two builds of the same packages produce the same digest. The walk never
// follows symlinks.
func treeDigest(ctx context.Context, dir string) (treeSum, error) {
	var entries []entry
	var size int64
	type inode struct{ dev, ino uint64 }
	seen := make(map[inode]bool)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("reading owner of %s: no stat data", p)
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		e := entry{
			rel:  filepath.ToSlash(rel),
			perm: st.Mode & 0o7777,
			uid:  st.Uid,
			gid:  st.Gid,
		}
		switch st.Mode & syscall.S_IFMT {
		case syscall.S_IFREG:
			e.kind = 'f'
			e.size = st.Size
			if k := (inode{uint64(st.Dev), st.Ino}); !seen[k] {
				seen[k] = true
				size += st.Size
			}
		case syscall.S_IFDIR:
			e.kind = 'd'
		case syscall.S_IFLNK:
			e.kind = 'l'
			if e.target, err = os.Readlink(p); err != nil {
				return err
			}
		case syscall.S_IFCHR:
			e.kind = 'c'
			e.rdev = uint64(st.Rdev)
		case syscall.S_IFBLK:
			e.kind = 'b'
			e.rdev = uint64(st.Rdev)
		case syscall.S_IFIFO:
			e.kind = 'p'
		case syscall.S_IFSOCK:
			e.kind = 's'
		default:
			return fmt.Errorf("%s has unknown file type %#o", p, st.Mode&syscall.S_IFMT)
		}
		entries = append(entries, e)
		return nil
	})
	if err != nil {
		return treeSum{}, fmt.Errorf("walking %s: %w", dir, err)
	}
	if err := hashContents(ctx, dir, entries); err != nil {
		return treeSum{}, err
	}

	h := sha256.New()
	io.WriteString(h, digestFormat+"\n")
	for i := range entries {
		writeEntry(h, &entries[i])
	}
	return treeSum{hex: hex.EncodeToString(h.Sum(nil)), size: size}, nil
}

// hashContents fills in the content hash of every regular file in entries,
// on as many goroutines as there are CPUs.
func hashContents(ctx context.Context, dir string, entries []entry) error {
	work := make(chan *entry)
	errc := make(chan error, 1)
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for e := range work {
				if err := hashFile(filepath.Join(dir, filepath.FromSlash(e.rel)), e); err != nil {
					select {
					case errc <- err:
					default:
					}
				}
			}
		})
	}
	var err error
feed:
	for i := range entries {
		if entries[i].kind != 'f' {
			continue
		}
		select {
		case work <- &entries[i]:
		case err = <-errc:
			break feed
		case <-ctx.Done():
			err = ctx.Err()
			break feed
		}
	}
	close(work)
	wg.Wait()
	if err == nil {
		select {
		case err = <-errc:
		default:
		}
	}
	if err != nil {
		return fmt.Errorf("hashing %s: %w", dir, err)
	}
	return nil
}

// hashFile stores the SHA-256 of the file at p in e. The file must still have
// the size recorded by the walk.
func hashFile(p string, e *entry) error {
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return fmt.Errorf("reading %s: %w", p, err)
	}
	if n != e.size {
		return fmt.Errorf("%s changed size while hashing (%d, then %d bytes)", p, e.size, n)
	}
	h.Sum(e.sum[:0])
	return nil
}

// writeEntry appends the encoding of e to h. Strings are length-prefixed so
// that no two different trees share an encoding.
func writeEntry(h hash.Hash, e *entry) {
	var b [8]byte
	str := func(s string) {
		binary.BigEndian.PutUint32(b[:4], uint32(len(s)))
		h.Write(b[:4])
		io.WriteString(h, s)
	}
	u32 := func(v uint32) {
		binary.BigEndian.PutUint32(b[:4], v)
		h.Write(b[:4])
	}
	u64 := func(v uint64) {
		binary.BigEndian.PutUint64(b[:], v)
		h.Write(b[:])
	}
	str(e.rel)
	h.Write([]byte{e.kind})
	u32(e.perm)
	u32(e.uid)
	u32(e.gid)
	switch e.kind {
	case 'f':
		u64(uint64(e.size))
		h.Write(e.sum[:])
	case 'l':
		str(e.target)
	case 'c', 'b':
		u64(e.rdev)
	}
}
