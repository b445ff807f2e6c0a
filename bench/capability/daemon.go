package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stockade-sh/stockade/api"
	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/internal/storeopen"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/store/sqlite"
	"github.com/stockade-sh/stockade/wire"
)

// daemon is the capability layer in this process, as `stockade serve` wires
// it: services, each behind the HTTP API on its own loopback listener and
// over a database of its own (a database serves one daemon at a time: the
// store's daemon claim refuses a second service), each database holding one
// workspace (approval none, credits granted) whose agent key the benchmark
// invokes with.
type daemon struct {
	dbURL   string // a PostgreSQL server, or empty for SQLite in dir
	dir     string
	credits int64
	client  *http.Client
	log     *slog.Logger
	// closers run in reverse order on close.
	closers []func()
}

// target is one service: its base URL and the agent key of its workspace.
type target struct{ url, key string }

// openDaemon returns a daemon whose services each get a database of dbURL
// (empty: SQLite in dir; postgres://: a fresh schema of that database,
// dropped on close) with credits for the whole run.
func openDaemon(dbURL, dir string, credits int64) *daemon {
	return &daemon{
		dbURL: dbURL, dir: dir, credits: credits,
		log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		client: &http.Client{Transport: &http.Transport{
			// Every client of the throughput runs keeps its connection.
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     time.Minute,
		}},
	}
}

// benchStore is what a benchmarked daemon needs of its store: the
// service's and the API's, and the setup of its workspace.
type benchStore interface {
	store.Store
	api.Store
	CreateWorkspace(ctx context.Context, name string, audit func(model.Workspace) []model.NewEvent) (model.Workspace, error)
	CreateAPIKey(ctx context.Context, k store.NewAPIKey) (model.APIKey, error)
	SetPolicy(ctx context.Context, workspaceID string, p model.Policy, audit func(model.Policy) []model.NewEvent) (model.Policy, error)
	GrantCredits(ctx context.Context, workspaceID string, amount int64, note string, audit []model.NewEvent) (model.Credits, error)
	Close() error
}

// openStore opens the database of the service called name and creates its
// workspace, returning the store and the agent key.
// A SQLite database runs with the synchronous setting sync (sqlite.SyncFull
// or sqlite.SyncNormal).
func (d *daemon) openStore(ctx context.Context, name, sync string) (benchStore, string, error) {
	var (
		st  benchStore
		err error
	)
	if d.dbURL != "" {
		var dbURL string
		if dbURL, err = d.freshSchema(ctx, d.dbURL); err != nil {
			return nil, "", err
		}
		st, err = storeopen.Open(ctx, dbURL)
	} else {
		st, err = sqlite.Open(ctx, sqlite.Config{Path: filepath.Join(d.dir, name+".db"), Synchronous: sync})
	}
	if err != nil {
		return nil, "", fmt.Errorf("opening the store: %w", err)
	}
	d.closers = append(d.closers, func() { st.Close() })
	ws, err := st.CreateWorkspace(ctx, "bench", nil)
	if err != nil {
		return nil, "", fmt.Errorf("creating the workspace: %w", err)
	}
	key := "sk_bench_" + rand.Text()
	if _, err := st.CreateAPIKey(ctx, store.NewAPIKey{WorkspaceID: ws.ID, Role: model.RoleAgent, Hash: model.HashKey(key), Name: "bench"}); err != nil {
		return nil, "", fmt.Errorf("creating the agent key: %w", err)
	}
	p, err := st.GetPolicy(ctx, ws.ID)
	if err != nil {
		return nil, "", fmt.Errorf("reading the policy: %w", err)
	}
	p.Approval = model.ApprovalNone
	if _, err := st.SetPolicy(ctx, ws.ID, p, nil); err != nil {
		return nil, "", fmt.Errorf("setting the policy: %w", err)
	}
	if _, err := st.GrantCredits(ctx, ws.ID, d.credits, "benchmark", nil); err != nil {
		return nil, "", fmt.Errorf("granting credits: %w", err)
	}
	return st, key, nil
}

// freshSchema creates an empty schema in the PostgreSQL database at dsn,
// to be dropped on close, and returns a DSN whose search_path selects it.
func (d *daemon) freshSchema(ctx context.Context, dsn string) (string, error) {
	u, err := url.Parse(dsn)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("-db must be a postgres:// URL, got %q", dsn)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "stockade_bench_" + hex.EncodeToString(b[:])
	exec := func(ctx context.Context, q string) error {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return fmt.Errorf("connecting to %s: %w", u.Redacted(), err)
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, q)
		return err
	}
	if err := exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return "", fmt.Errorf("creating schema %s: %w", schema, err)
	}
	d.closers = append(d.closers, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			d.log.Error("dropping the benchmark schema", "schema", schema, "err", err)
		}
	})
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// serve starts a service over eng and a database of its own, named after
// o.Owner (SQLite's with the synchronous setting sync), serves it on a
// fresh loopback listener and returns it.
func (d *daemon) serve(ctx context.Context, eng *engine.Engine, o capability.ServiceOptions, sync string) (target, error) {
	st, key, err := d.openStore(ctx, o.Owner, sync)
	if err != nil {
		return target{}, err
	}
	metrics := api.NewMetrics()
	o.Observer, o.Logger = metrics, d.log
	svc := capability.NewService(eng, st, o)
	if err := svc.Start(ctx); err != nil {
		return target{}, fmt.Errorf("starting the service %s: %w", o.Owner, err)
	}
	d.closers = append(d.closers, func() { svc.Close(context.WithoutCancel(ctx)) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return target{}, err
	}
	srv := &http.Server{Handler: api.New(svc, st, api.Options{Metrics: metrics, Logger: d.log}), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			d.log.Error("serving", "err", err)
		}
	}()
	d.closers = append(d.closers, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	return target{url: "http://" + ln.Addr().String(), key: key}, nil
}

// invoke POSTs body to t's /v1/executions, synchronously, and checks that
// the execution succeeded and printed want.
func (d *daemon) invoke(ctx context.Context, t target, body []byte, want string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.url+"/v1/executions", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+t.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := d.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("reading the response: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST /v1/executions: %s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	var v wire.Execution
	var r engine.Result
	if err := json.Unmarshal(b, &v); err != nil {
		return fmt.Errorf("decoding the execution: %w", err)
	}
	if err := json.Unmarshal(v.Result.JSON(), &r); err != nil || string(v.Status) != string(model.StatusSucceeded) || r.Stdout != want {
		return fmt.Errorf("unexpected execution %s", b)
	}
	return nil
}

// close stops the services and servers and closes the store.
func (d *daemon) close() {
	for _, c := range slices.Backward(d.closers) {
		c()
	}
	d.closers = nil
}
