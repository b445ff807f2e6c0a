package kubernetes

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/registry"
	"github.com/stockade-sh/stockade/internal/registry/registrytest"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/sandbox/profile"
)

// testImage writes a small root filesystem (a file, a hard link, a
// symlink, a directory) and a guest, and returns them as an image.
func testImage(t *testing.T) (sandbox.Image, string) {
	t.Helper()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "usr", "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "usr", "bin", "tool"), []byte("#!/bin/sh\necho hi\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(root, "usr", "bin", "tool"), filepath.Join(root, "usr", "bin", "tool2")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("usr/bin", filepath.Join(root, "bin")); err != nil {
		t.Fatal(err)
	}
	guest := filepath.Join(t.TempDir(), "guest")
	if err := os.WriteFile(guest, []byte("the guest agent"), 0o755); err != nil {
		t.Fatal(err)
	}
	return sandbox.Image{Name: "shell", Digest: "sha256:" + strings.Repeat("ab", 32), Rootfs: root}, guest
}

// TestRegistryPush pushes an image to Debian's docker-registry twice (the
// second time uploads nothing: no POST, PUT or PATCH), resolves it as the
// driver does (the pushed digest after the files' owners and mtimes
// changed; an image never pushed FailedPrecondition, the registry down
// Unavailable), reads its manifest back by that digest, and checks its
// layer: the same blob, holding the guest.
func TestRegistryPush(t *testing.T) {
	addr, counts := registrytest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	img, guest := testImage(t)
	loc, err := registry.ParseLocation("http://"+addr+"/team/stockade", false)
	if err != nil {
		t.Fatal(err)
	}
	c, err := registry.New(loc, registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	o, err := NewOCIImage(img, guest)
	if err != nil {
		t.Fatal(err)
	}
	digest, st, err := c.Push(ctx, o.Name, o.Tag, o.Blobs(), o.Manifest)
	if err != nil {
		t.Fatal(err)
	}
	first := counts()
	if digest != o.Digest || st.Uploaded != 2 || !st.ManifestPut || first[http.MethodPut] != 3 || first[http.MethodPost] != 2 {
		t.Fatalf("first push: digest %s (want %s), %+v, requests %v; want 2 blobs uploaded (2 POST, 3 PUT with the manifest's)", digest, o.Digest, st, first)
	}

	// The same image again, its guest installed anew (another mtime):
	// the same digest, and nothing uploaded.
	if err := os.Chtimes(guest, time.Now(), time.Now().Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	again, err := NewOCIImage(img, guest)
	if err != nil {
		t.Fatal(err)
	}
	digest2, st, err := c.Push(ctx, again.Name, again.Tag, again.Blobs(), again.Manifest)
	if err != nil {
		t.Fatal(err)
	}
	second := counts()
	if digest2 != digest || st.Uploaded != 0 || st.ManifestPut || second[http.MethodHead] != 3 || len(second) != 1 {
		t.Fatalf("second push: digest %s (want %s), %+v, requests %v; want only 3 HEAD", digest2, digest, st, second)
	}

	// The driver names the pushed image by the digest its tag names in
	// the registry, even when the image's files lie otherwise than where
	// it was pushed from (a copy by a non-root pod: other owners and
	// mtimes, so another layer), and asks the registry once.
	d, err := New(Config{Namespace: "ns", Tier: sandbox.TierGVisor, GuestPath: guest, Registry: addr + "/team/stockade", RegistryInsecure: true, REST: &rest.Config{Host: "https://cluster.invalid"}})
	if err != nil {
		t.Fatal(err)
	}
	tool := filepath.Join(img.Rootfs, "usr", "bin", "tool")
	if err := os.Chown(tool, 65532, 65532); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(tool, time.Now(), time.Now().Add(-48*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if moved, err := NewOCIImage(img, guest); err != nil || moved.Digest == digest {
		t.Fatalf("the layer after chown and chtimes: digest %s (pushed %s), %v; want another digest", moved.Digest, digest, err)
	}
	for range 2 {
		ref, pull, err := d.imageRef(ctx, img)
		if err != nil {
			t.Fatal(err)
		}
		if want := addr + "/team/stockade/shell@" + digest; ref != want || pull != corev1.PullIfNotPresent {
			t.Fatalf("pod image %s (%s), want %s (IfNotPresent)", ref, pull, want)
		}
	}
	if asked := counts(); asked[http.MethodHead] != 1 || len(asked) != 1 {
		t.Fatalf("two Creates' image asked the registry %v; want one HEAD", asked)
	}
	// An image never pushed (another image digest: another tag).
	unpushed := img
	unpushed.Digest = "sha256:" + strings.Repeat("cd", 32)
	_, _, err = d.imageRef(ctx, unpushed)
	if msg, _ := errdefs.PublicMessage(err); !errdefs.IsFailedPrecondition(err) || !strings.Contains(msg, "stockade image push") {
		t.Fatalf("pod image of an image never pushed: %v (public %q), want FailedPrecondition naming the push", err, msg)
	}
	// A registry that does not answer.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	gone, err := New(Config{Namespace: "ns", Tier: sandbox.TierGVisor, GuestPath: guest, Registry: closed, RegistryInsecure: true, REST: &rest.Config{Host: "https://cluster.invalid"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := gone.imageRef(ctx, img); !errdefs.IsUnavailable(err) {
		t.Fatalf("pod image with the registry down: %v, want Unavailable", err)
	}
	// A template whose name no repository may have: the operator's
	// problem, not the client's request.
	odd := img
	odd.Name = "My_Template"
	if _, _, err := d.imageRef(ctx, odd); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("pod image of %q: %v, want FailedPrecondition", odd.Name, err)
	}

	raw := get(t, "http://"+addr+"/v2/team/stockade/shell/manifests/"+digest)
	if sum := sha256.Sum256(raw); "sha256:"+hex.EncodeToString(sum[:]) != digest {
		t.Fatalf("manifest %s answered by %s has another digest", digest, raw)
	}
	m, err := registry.ParseManifest(raw)
	if err != nil {
		t.Fatal(err)
	}
	if string(raw) != string(o.Manifest) || len(m.Layers) != 1 || m.Layers[0].Digest != o.Layer.Digest || m.Layers[0].Size != o.Layer.Size || m.Config.Digest != o.Config.Digest {
		t.Fatalf("manifest %s, want %s", raw, o.Manifest)
	}
	resp, err := http.Get("http://" + addr + "/v2/team/stockade/shell/blobs/" + m.Layers[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	h := sha256.New()
	names := map[string]bool{}
	tr := tar.NewReader(io.TeeReader(resp.Body, h))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names[hdr.Name] = true
	}
	io.Copy(h, resp.Body)
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != m.Layers[0].Digest || !names["usr/bin/tool"] || !names[strings.TrimPrefix(profile.GuestPath, "/")] {
		t.Fatalf("layer %s (want %s) holds %v", got, m.Layers[0].Digest, names)
	}
}

// get returns the body of a GET of u, which must answer 200.
func get(t *testing.T, u string) []byte {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", registry.MediaTypeManifest)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, registry.MaxManifestSize))
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s, %v", u, resp.Status, err)
	}
	return body
}

// TestPullFailureClass holds the class of a pod whose image the kubelet
// cannot pull (the kubelet's and containerd's own messages): only an
// image by digest that the configured registry lacks is
// FailedPrecondition naming the command that pushes, in what the client
// may read; any other failure is ErrUnavailable, which a client retries.
func TestPullFailureClass(t *testing.T) {
	ref := "10.0.0.1:5000/stockade/python@sha256:" + strings.Repeat("0", 64)
	// As the test cluster's kubelet said it (TestClusterRegistry).
	notFound := `rpc error: code = NotFound desc = failed to pull and unpack image "` + ref + `": failed to resolve image: ` + ref + `: not found`
	for _, tc := range []struct {
		image, reason, msg string
		registry, push     bool
	}{
		{ref, "ErrImagePull", notFound, true, true},
		{ref, "ImagePullBackOff", `Back-off pulling image "` + ref + `": ErrImagePull: ` + notFound, true, true},
		{ref, "ErrImagePull", `failed to copy: httpReadSeeker: failed open: unexpected status code: 404 Not Found - Server message: BLOB_UNKNOWN: blob unknown to registry`, true, true},
		{ref, "ErrImagePull", notFound, false, false}, // Config.ImageRef's image
		{ref, "ErrImagePull", `failed to resolve reference "` + ref + `": failed to do request: Head "http://10.0.0.1:5000/v2/stockade/python/manifests/sha256:00": dial tcp 10.0.0.1:5000: connect: connection refused`, true, false},
		{ref, "ErrImagePull", `failed to resolve reference "` + ref + `": pull access denied, repository does not exist or may require authorization: authorization failed: 401 Unauthorized`, true, false},
		{ref, "ImagePullBackOff", `Back-off pulling image "` + ref + `": ErrImagePull: unexpected status from HEAD request: 429 Too Many Requests`, true, false},
		{ref, "ImagePullBackOff", `Back-off pulling image "` + ref + `"`, true, false},
		{"registry.example/python:latest", "ErrImagePull", `failed to resolve reference: not found`, true, false},
	} {
		p := &corev1.Pod{}
		p.Name = "sbx-1"
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{
			Name: containerName, Image: tc.image,
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: tc.reason, Message: tc.msg}},
		}}
		done, err := running(p, tc.registry)
		msg, public := errdefs.PublicMessage(err)
		pushes := public && strings.Contains(msg, "stockade image push") && strings.Contains(msg, `"python"`)
		if !done || err == nil || pushes != tc.push || errdefs.IsFailedPrecondition(err) != tc.push || errdefs.IsUnavailable(err) == tc.push {
			t.Errorf("%s %q (registry %v): running = %v, %v (public %q); want push hint %v", tc.reason, tc.msg, tc.registry, done, err, msg, tc.push)
		}
		if !tc.push && !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: the error %v lacks the kubelet's message", tc.reason, err)
		}
	}
	// An image imported on the node keeps the kubelet's reason.
	p := &corev1.Pod{}
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: containerName, Image: "stockade.invalid/python:x",
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ErrImageNeverPull"}}}}
	if _, err := running(p, true); err == nil || strings.Contains(err.Error(), "image push") || !errdefs.IsUnavailable(err) {
		t.Fatalf("running with an imported image: %v", err)
	}
}
