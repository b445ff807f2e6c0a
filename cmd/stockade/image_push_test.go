package main

import (
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/driver/kubernetes"
	"github.com/stockade-sh/stockade/internal/registry/registrytest"
	"github.com/stockade-sh/stockade/internal/testenv"
)

// TestImagePush pushes the shell image to Debian's docker-registry with
// the CLI, twice: it prints the reference by the digest the kubernetes
// driver computes for the image, and the second time uploads nothing.
func TestImagePush(t *testing.T) {
	img := testenv.Image(t, "shell")
	guest := testenv.Guest(t)
	addr, counts := registrytest.Start(t)
	o, err := kubernetes.NewOCIImage(img, guest)
	if err != nil {
		t.Fatal(err)
	}
	want := "shell: " + addr + "/cli/shell@" + o.Digest + "  ("
	push := func() string {
		t.Helper()
		code, stdout, stderr := runCLI(t, nil, "image", "push", "--data-dir", testenv.DataDir(), "--guest", guest, "http://"+addr+"/cli", "shell")
		if code != 0 {
			t.Fatalf("image push: exit %d: %s", code, stderr)
		}
		return stdout
	}
	out := push()
	if !strings.HasPrefix(out, want+"uploaded 2 of 2 blobs") || counts()["PUT"] != 3 {
		t.Fatalf("first push printed %q, want %q...uploaded 2 of 2 blobs", out, want)
	}
	out = push()
	if c := counts(); !strings.HasPrefix(out, want+"already there") || c["PUT"]+c["POST"]+c["PATCH"] != 0 {
		t.Fatalf("second push printed %q with requests %v, want %q...already there and only HEAD", out, c, want)
	}
}

// TestImagePushRefusesPlainHTTP holds that plain http goes to loopback
// only, unless --insecure.
func TestImagePushRefusesPlainHTTP(t *testing.T) {
	code, _, stderr := runCLI(t, nil, "image", "push", "--data-dir", t.TempDir(), "http://192.0.2.1:5000/x")
	if code != exitUsage || !strings.Contains(stderr, "plain http") {
		t.Fatalf("image push to http://192.0.2.1: exit %d: %s", code, stderr)
	}
}
