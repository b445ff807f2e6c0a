package e2b

import (
	"compress/gzip"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/sandbox"
)

// Paths. A sandbox's writable tree is its session's /workspace, which is
// also its user's home: /home/user (E2B's home), ~ and relative paths
// name it, and answers name files as the request did.
const (
	workspaceDir = "/workspace"
	homeDir      = "/home/user"
)

// maxUploadParts bounds the files of one multipart upload.
const maxUploadParts = 64

// sandboxPath maps a path of the E2B wire onto the session's files path:
// it returns the path below /workspace and the prefix the client used
// for it (/home/user or /workspace), or a clear error for a path outside
// the writable tree.
func sandboxPath(p string) (inner, prefix string, err error) {
	switch {
	case p == "":
		return "", "", errdefs.Publicf("a path is required: %w", errdefs.ErrInvalidArgument)
	case strings.ContainsRune(p, 0):
		return "", "", errdefs.Publicf("path %q has a NUL byte: %w", p, errdefs.ErrInvalidArgument)
	case p == "~" || strings.HasPrefix(p, "~/"):
		p = homeDir + p[1:]
	case !strings.HasPrefix(p, "/"):
		p = homeDir + "/" + p
	}
	for _, c := range strings.Split(p, "/") {
		if c == ".." {
			return "", "", errdefs.Publicf("path %q has a \"..\" component: %w", p, errdefs.ErrInvalidArgument)
		}
	}
	p = path.Clean(p)
	for _, root := range []string{homeDir, workspaceDir} {
		if p == root {
			return workspaceDir, root, nil
		}
		if rest, ok := strings.CutPrefix(p, root+"/"); ok {
			return workspaceDir + "/" + rest, root, nil
		}
	}
	return "", "", errdefs.Publicf("path %q is outside the sandbox's writable tree: %s (also named %s): %w", p, homeDir, workspaceDir, errdefs.ErrInvalidArgument)
}

// clientPath is inner (below /workspace) as the client named it.
func clientPath(inner, prefix string) string {
	if prefix == "" || prefix == workspaceDir {
		return inner
	}
	if inner == workspaceDir {
		return prefix
	}
	return prefix + strings.TrimPrefix(inner, workspaceDir)
}

func (s *Server) routeEnvd() {
	m := s.envd
	m.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	m.HandleFunc("GET /files", s.download)
	m.HandleFunc("POST /files", s.upload)
	m.HandleFunc("POST /process.Process/{method}", s.process)
	m.HandleFunc("POST /filesystem.Filesystem/{method}", s.filesystem)
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if strings.Count(r.URL.Path, "/") == 2 && strings.Contains(r.URL.Path, ".") {
			writeUnary(w, nil, &rpcError{Code: "unimplemented", Message: "no method " + quote(r.URL.Path)})
			return
		}
		writeError(w, http.StatusNotFound, "envd has no "+r.Method+" "+quote(r.URL.Path))
	})
}

// target is the request's sandbox, which the router resolved.
func target(r *http.Request) Target {
	t, _ := TargetFrom(r.Context())
	return t
}

// envdFail answers an envd REST error: E2B's {"code", "message"} shape
// with the status of err's class (404 NotFoundError, 400
// InvalidArgumentError, 507 for a full workspace).
func (s *Server) envdFail(w http.ResponseWriter, r *http.Request, err error) {
	if errdefs.IsTooLarge(err) && strings.Contains(messageOf(err), "space") {
		writeError(w, http.StatusInsufficientStorage, messageOf(err))
		return
	}
	s.fail(w, r, err)
}

func (s *Server) download(w http.ResponseWriter, r *http.Request) {
	t := target(r)
	inner, _, err := sandboxPath(r.URL.Query().Get("path"))
	if err != nil {
		s.envdFail(w, r, err)
		return
	}
	b, _, err := s.svc.GetFile(r.Context(), t.Principal, t.SessionID, inner)
	if err != nil {
		s.envdFail(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": path.Base(inner)}))
	if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") && len(b) > 1024 {
		w.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		_, _ = zw.Write(b)
		_ = zw.Close()
		return
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	_, _ = w.Write(b)
}

// writeInfo is envd's EntryInfo of a written file.
type writeInfo struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Path string `json:"path"`
}

// upload writes the files of a POST /files: an octet-stream body (gzip
// when Content-Encoding says so) to ?path=, or each part of a multipart
// body to ?path= or, without it, to the part's file name.
func (s *Server) upload(w http.ResponseWriter, r *http.Request) {
	t := target(r)
	query := r.URL.Query().Get("path")
	ct, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	body := io.Reader(r.Body)
	switch enc := r.Header.Get("Content-Encoding"); enc {
	case "", "identity":
	case "gzip":
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			s.envdFail(w, r, errdefs.Publicf("the body is not gzip: %w", errdefs.ErrInvalidArgument))
			return
		}
		defer zr.Close()
		body = zr
	default:
		s.envdFail(w, r, errdefs.Publicf("Content-Encoding %s is not gzip: %w", quote(enc), errdefs.ErrInvalidArgument))
		return
	}
	var out []writeInfo
	put := func(p string, rd io.Reader) error {
		inner, prefix, err := sandboxPath(p)
		if err != nil {
			return err
		}
		if _, err := s.svc.PutFile(r.Context(), t.Principal, t.SessionID, inner, rd); err != nil {
			return err
		}
		out = append(out, writeInfo{Name: path.Base(inner), Type: "file", Path: clientPath(inner, prefix)})
		return nil
	}
	switch {
	case ct == "multipart/form-data":
		if err := s.multipartUpload(body, params["boundary"], query, put); err != nil {
			s.envdFail(w, r, err)
			return
		}
	default:
		if err := put(query, body); err != nil {
			s.envdFail(w, r, err)
			return
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// multipartUpload hands each file part of a multipart body to put: at
// most maxUploadParts, each to query or, without it, its file name.
func (s *Server) multipartUpload(body io.Reader, boundary, query string, put func(string, io.Reader) error) error {
	if boundary == "" || len(boundary) > 70 {
		return errdefs.Publicf("a multipart body needs a boundary of 1 to 70 characters: %w", errdefs.ErrInvalidArgument)
	}
	mr := multipart.NewReader(body, boundary)
	n := 0
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return errdefs.Publicf("reading the multipart body: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		if part.FormName() != "file" {
			_ = part.Close()
			continue
		}
		if n++; n > maxUploadParts {
			return errdefs.Publicf("more than %d files in one upload: %w", maxUploadParts, errdefs.ErrTooLarge)
		}
		p := query
		if p == "" {
			// The part's file name is the file's path: read it whole
			// (Part.FileName keeps only its base).
			_, params, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
			p = params["filename"]
		}
		err = put(p, part)
		_ = part.Close()
		if err != nil {
			return err
		}
	}
	if n == 0 {
		return errdefs.Publicf("the multipart body has no file part: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}

// entryInfo is filesystem.EntryInfo in protobuf's JSON mapping (an int64
// is a string, an enum its name).
type entryInfo struct {
	Name         string `json:"name"`
	Type         string `json:"type"`
	Path         string `json:"path"`
	Size         string `json:"size"`
	Mode         uint32 `json:"mode"`
	Permissions  string `json:"permissions"`
	Owner        string `json:"owner"`
	Group        string `json:"group"`
	ModifiedTime string `json:"modifiedTime,omitempty"`
}

func entryOf(fi sandbox.FileInfo, clientFull string) entryInfo {
	typ := "FILE_TYPE_FILE"
	mode := uint32(fi.Mode.Perm())
	switch fi.Type {
	case sandbox.TypeDir:
		typ = "FILE_TYPE_DIRECTORY"
		mode |= 1 << 31 // os.ModeDir, as envd reports it
	case sandbox.TypeSymlink:
		typ = "FILE_TYPE_SYMLINK"
	case sandbox.TypeFile:
	default:
		typ = "FILE_TYPE_UNSPECIFIED"
	}
	e := entryInfo{Name: path.Base(clientFull), Type: typ, Path: clientFull, Size: strconv.FormatInt(fi.Size, 10), Mode: mode,
		Permissions: fi.Mode.Perm().String(), Owner: "user", Group: "user"}
	if fi.Type == sandbox.TypeDir {
		e.Permissions = "d" + e.Permissions[1:]
	}
	if !fi.ModTime.IsZero() {
		e.ModifiedTime = fi.ModTime.UTC().Format(time.RFC3339Nano)
	}
	return e
}

// fsRequest is the union of the filesystem service's requests this
// server reads.
type fsRequest struct {
	Path        string `json:"path"`
	Depth       int    `json:"depth"`
	Source      string `json:"source"`
	Destination string `json:"destination"`
}

// maxListDepth bounds a ListDir's depth.
const maxListDepth = 8

// filesystem serves filesystem.Filesystem's unary methods.
func (s *Server) filesystem(w http.ResponseWriter, r *http.Request) {
	t := target(r)
	method := r.PathValue("method")
	switch method {
	case "WatchDir":
		s.watchDir(w, r, t)
		return
	case "Stat", "ListDir", "MakeDir", "Move", "Remove":
	default:
		writeUnary(w, nil, &rpcError{Code: "unimplemented", Message: "filesystem.Filesystem/" + method + " is not served"})
		return
	}
	var req fsRequest
	if err := rpcRequest(r, false, &req); err != nil {
		writeUnary(w, nil, err)
		return
	}
	ctx := r.Context()
	if method == "Move" {
		src, _, err := sandboxPath(req.Source)
		if err != nil {
			writeUnary(w, nil, err)
			return
		}
		dst, prefix, err := sandboxPath(req.Destination)
		if err != nil {
			writeUnary(w, nil, err)
			return
		}
		fi, err := s.svc.MoveFile(ctx, t.Principal, t.SessionID, src, dst)
		writeUnary(w, map[string]any{"entry": entryOf(fi, clientPath(dst, prefix))}, err)
		return
	}
	inner, prefix, err := sandboxPath(req.Path)
	if err != nil {
		writeUnary(w, nil, err)
		return
	}
	switch method {
	case "Stat":
		fi, err := s.stat(r, t, inner)
		writeUnary(w, map[string]any{"entry": entryOf(fi, clientPath(inner, prefix))}, err)
	case "MakeDir":
		if err := s.svc.MakeDir(ctx, t.Principal, t.SessionID, inner); err != nil {
			writeUnary(w, nil, err)
			return
		}
		fi, err := s.stat(r, t, inner)
		writeUnary(w, map[string]any{"entry": entryOf(fi, clientPath(inner, prefix))}, err)
	case "Remove":
		budget := maxRemove
		writeUnary(w, struct{}{}, s.removeAll(r, t, inner, &budget))
	case "ListDir":
		depth := req.Depth
		if depth <= 0 {
			depth = 1
		}
		if depth > maxListDepth {
			writeUnary(w, nil, errdefs.Publicf("depth %d is more than %d: %w", depth, maxListDepth, errdefs.ErrInvalidArgument))
			return
		}
		entries := []entryInfo{}
		if err := s.listDir(r, t, inner, prefix, depth, &entries); err != nil {
			writeUnary(w, nil, err)
			return
		}
		writeUnary(w, map[string]any{"entries": entries}, nil)
	}
}

// maxRemove bounds the entries one Remove removes.
const maxRemove = 20000

// removeAll removes inner and, for a directory, what it holds, as envd
// does (each removal audited through the files path); budget bounds the
// entries removed.
func (s *Server) removeAll(r *http.Request, t Target, inner string, budget *int) error {
	if inner == workspaceDir {
		return errdefs.Publicf("the sandbox's home (%s) itself cannot be removed: %w", homeDir, errdefs.ErrInvalidArgument)
	}
	fi, err := s.svc.StatFile(r.Context(), t.Principal, t.SessionID, inner)
	if err != nil {
		return err
	}
	if fi.Type == sandbox.TypeDir {
		for {
			fis, _, err := s.svc.ListFiles(r.Context(), t.Principal, t.SessionID, inner)
			if err != nil {
				return err
			}
			if len(fis) == 0 {
				break
			}
			for _, c := range fis {
				if err := s.removeAll(r, t, inner+"/"+c.Name, budget); err != nil {
					return err
				}
			}
		}
	}
	if *budget--; *budget < 0 {
		return errdefs.Publicf("removing more than %d entries at once: %w", maxRemove, errdefs.ErrTooLarge)
	}
	return s.svc.RemoveFile(r.Context(), t.Principal, t.SessionID, inner)
}

// stat describes inner; /workspace itself is a directory.
func (s *Server) stat(r *http.Request, t Target, inner string) (sandbox.FileInfo, error) {
	if inner == workspaceDir {
		return sandbox.FileInfo{Name: "workspace", Type: sandbox.TypeDir, Mode: 0o755}, nil
	}
	return s.svc.StatFile(r.Context(), t.Principal, t.SessionID, inner)
}

// listDir appends the entries of directory inner, and of its
// directories down to depth, to out (at most sandbox.MaxListEntries).
func (s *Server) listDir(r *http.Request, t Target, inner, prefix string, depth int, out *[]entryInfo) error {
	fis, _, err := s.svc.ListFiles(r.Context(), t.Principal, t.SessionID, inner)
	if err != nil {
		// ListDir of a file is invalid_argument, as envd answers it.
		return err
	}
	for _, fi := range fis {
		if len(*out) >= sandbox.MaxListEntries {
			return nil
		}
		child := inner + "/" + fi.Name
		*out = append(*out, entryOf(fi, clientPath(child, prefix)))
		if fi.Type == sandbox.TypeDir && depth > 1 {
			if err := s.listDir(r, t, child, prefix, depth-1, out); err != nil {
				return err
			}
		}
	}
	return nil
}
