package tools

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/stockade-sh/stockade/internal/dataroot"
	"github.com/stockade-sh/stockade/sandbox"
)

// maxTreeEntries bounds the entries below one mount source: past it the
// mount is refused (RuleMountTooLarge), since what the check has not seen
// it cannot vouch for. A variable so that tests can lower it.
var maxTreeEntries = 100000

// trustAfter is how old a directory's change time must be before its
// remembered contents stand for it. A file system stamps changes with a
// coarse clock (a tick of a few milliseconds), so a directory read and then
// changed within the same tick keeps its change time; one changed in the
// last trustAfter is read again at every check.
const trustAfter = time.Second

// A MountChecker resolves a tool's mounts before each run (see
// ResolveMounts) and checks, every time, that no unix socket and no
// credentials directory has appeared anywhere below them since the tool was
// loaded: a read-only bind still lets the sandbox connect to a socket and
// read every credential. It remembers each directory it read with its
// change time, so that a check again reads only the directories that
// changed (creating, removing or renaming an entry changes its directory's)
// and stats the others. It is safe for concurrent use.
type MountChecker struct {
	opts Options
	// now is the clock that decides which directories are old enough to
	// be remembered; tests move it.
	now func() time.Time

	mu    sync.Mutex
	trees map[string]*tree // by resolved mount source
}

// NewMountChecker returns a checker of mounts under opts.DataRoot.
func NewMountChecker(opts Options) *MountChecker {
	return &MountChecker{opts: opts, now: time.Now, trees: map[string]*tree{}}
}

// Resolve is ResolveMounts with the checker's memory of the trees.
func (c *MountChecker) Resolve(t Tool) ([]sandbox.Mount, error) {
	if len(t.Filesystem.Mounts) == 0 {
		return nil, nil
	}
	root := dataroot.Resolve(c.opts.DataRoot)
	if err := root.Err(); err != nil {
		return nil, Problems{{Source: t.Source, Tool: t.Name, Rule: RuleDataRoot, Message: err.Error()}}
	}
	var ps Problems
	ms := make([]sandbox.Mount, 0, len(t.Filesystem.Mounts))
	for i, m := range t.Filesystem.Mounts {
		resolved, mps := checkMount(m, root)
		if resolved != "" {
			if p := c.tree(resolved).check(resolved, m.Source, c.now()); p != nil {
				mps = append(mps, *p)
			}
		}
		if len(mps) > 0 {
			for _, p := range mps {
				p.Source, p.Tool = t.mountSource(i), t.Name
				ps = append(ps, p)
			}
			continue
		}
		ms = append(ms, sandbox.Mount{Source: resolved, Target: filepath.Clean(m.Target)})
	}
	if len(ps) > 0 {
		return nil, ps
	}
	return ms, nil
}

// tree returns the remembered tree of the resolved source dir.
func (c *MountChecker) tree(dir string) *tree {
	c.mu.Lock()
	defer c.mu.Unlock()
	tr := c.trees[dir]
	if tr == nil {
		tr = &tree{}
		c.trees[dir] = tr
	}
	return tr
}

// checkTree walks the tree below dir, the directory a mount source resolved
// to (src as the record names it), once, remembering nothing.
func checkTree(dir, src string) *Problem {
	return (&tree{}).check(dir, src, time.Now())
}

// tree is what the last check saw below one mount source.
type tree struct {
	mu   sync.Mutex // held for a whole check
	dirs map[string]treeDir
	// reads counts the directories read, for tests of the memory.
	reads int
}

// treeDir is a directory of a tree as a check read it.
type treeDir struct {
	stamp   dirStamp
	entries int      // directly in it
	subdirs []string // their paths
	// trusted is set when the directory had not changed for trustAfter
	// when it was read: a later check may take stamp for its contents.
	trusted bool
}

// dirStamp identifies a directory's contents: any change of its entries
// moves its change time, which no system call can set back.
type dirStamp struct {
	dev, ino     uint64
	mtime, ctime int64 // nanoseconds
}

func stampOf(fi fs.FileInfo) (dirStamp, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return dirStamp{}, false
	}
	return dirStamp{dev: uint64(st.Dev), ino: st.Ino, mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano()}, true
}

// check returns a problem for a unix socket or a credentials directory
// anywhere below dir, or for a tree of more than maxTreeEntries entries, or
// nil. Unreadable directories are skipped: the sandbox cannot read them
// either. Directories whose stamp is the one remembered are not read again.
func (tr *tree) check(dir, src string, now time.Time) *Problem {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	seen := make(map[string]treeDir, len(tr.dirs))
	total := 0
	for stack := []string{dir}; len(stack) > 0; {
		p := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		fi, err := os.Lstat(p)
		if err != nil || !fi.IsDir() {
			continue // gone since its parent was read, or unreadable
		}
		stamp, ok := stampOf(fi)
		d, known := tr.dirs[p]
		if !known || !d.trusted || !ok || d.stamp != stamp {
			var prob *Problem
			if d, prob = tr.read(p, dir, src, stamp, now, total); prob != nil {
				tr.dirs = nil // nothing of a refused tree is remembered
				return prob
			}
			d.trusted = d.trusted && ok
		}
		if total += d.entries; total > maxTreeEntries {
			tr.dirs = nil
			return tooLarge(src)
		}
		seen[p] = d
		stack = append(stack, d.subdirs...)
	}
	tr.dirs = seen
	return nil
}

// read reads the directory p below the mount's top dir, whose stamp was
// taken before, and checks each entry. total is the count of entries seen so
// far in the tree, so that one huge directory is not read to its end.
func (tr *tree) read(p, top, src string, stamp dirStamp, now time.Time, total int) (treeDir, *Problem) {
	tr.reads++
	d := treeDir{stamp: stamp, trusted: now.UnixNano()-stamp.ctime > int64(trustAfter) && now.UnixNano()-stamp.mtime > int64(trustAfter)}
	f, err := os.Open(p)
	if err != nil {
		return treeDir{}, nil
	}
	defer f.Close()
	for {
		es, err := f.ReadDir(1024)
		for _, e := range es {
			if d.entries++; total+d.entries > maxTreeEntries {
				return treeDir{}, tooLarge(src)
			}
			ep := filepath.Join(p, e.Name())
			rel, _ := filepath.Rel(top, ep)
			switch {
			case e.Type()&fs.ModeSocket != 0:
				return treeDir{}, &Problem{Rule: RuleMountSocket, Message: fmt.Sprintf("mount source %s contains the unix socket %s; sockets are never mounted", src, filepath.Join(src, rel))}
			case e.IsDir() && dataroot.IsCredentialDir(rel):
				return treeDir{}, &Problem{Rule: RuleMountCredentials, Message: fmt.Sprintf("mount source %s contains %s; credentials are never mounted", src, filepath.Join(src, rel))}
			case e.IsDir():
				d.subdirs = append(d.subdirs, ep)
			}
		}
		if errors.Is(err, io.EOF) || (err == nil && len(es) == 0) {
			return d, nil
		}
		if err != nil {
			// Read part way: what was read is checked, the rest is as
			// unreadable to the sandbox; read it all again next time.
			d.trusted = false
			return d, nil
		}
	}
}

func tooLarge(src string) *Problem {
	return &Problem{Rule: RuleMountTooLarge, Message: fmt.Sprintf("mount source %s holds more than %d entries below it, more than Stockade checks for sockets and credentials directories; mount a smaller directory", src, maxTreeEntries)}
}
