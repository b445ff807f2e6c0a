package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/e2b"
)

// serveE2B starts the E2B listener when cfg.E2B.Listen is set (package
// e2b: the control plane and the sandboxes' envd and interpreter on one
// address) and returns what stops it; without an address it serves
// nothing. Requests get reqCtx, which ends when shutdown begins; the
// access tokens' secret is kept beside the database db.
func serveE2B(reqCtx context.Context, cfg config.Config, db string, svc *capability.Service, st any, log *slog.Logger) (func(), error) {
	if cfg.E2B.Listen == "" {
		return func() {}, nil
	}
	est, ok := st.(e2b.Store)
	if !ok {
		return nil, errors.New("e2b: the database keeps no E2B sandboxes")
	}
	secret, err := e2b.LoadSecret(e2b.SecretPath(db, cfg.DataDir))
	if err != nil {
		return nil, err
	}
	so := svc.Options().Sessions
	srv, err := e2b.New(svc, est, e2b.Options{Interpreter: e2b.NewInterpreter(svc, log.With("listener", "e2b")), Secret: secret, TTL: so.MaxTTL, IdleTimeout: so.MaxIdleTimeout,
		Logger: log.With("listener", "e2b")})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.E2B.Listen)
	if err != nil {
		return nil, usageError{fmt.Errorf("listening on %s (e2b.listen): %w", cfg.E2B.Listen, err)}
	}
	hs := &http.Server{Handler: srv, IdleTimeout: cfg.IdleTimeout, ReadHeaderTimeout: cfg.HeaderTimeout,
		BaseContext: func(net.Listener) context.Context { return reqCtx }}
	sweepCtx, stopSweep := context.WithCancel(reqCtx)
	go srv.Run(sweepCtx)
	go func() {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("the e2b listener stopped", "err", err)
		}
	}()
	log.Info("serving the E2B wire", "listen", ln.Addr().String())
	return func() {
		stopSweep()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(ctx)
	}, nil
}
