package analytics

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
)

// ClickHouse is a Sink on a ClickHouse server's HTTP interface: it inserts
// rows with INSERT ... FORMAT JSONEachRow and creates its database and table
// with CREATE ... IF NOT EXISTS. It is safe for concurrent use.
//
// It speaks HTTP with net/http rather than through
// github.com/ClickHouse/clickhouse-go/v2, because that client does not work
// with the ClickHouse that Debian 12 ships (clickhouse-server
// 18.16.1+ds-7.3+b2, protocol revision 54412). Tried with v2.51.0: over
// HTTP (Protocol: clickhouse.HTTP) every call fails, the server refusing
// the client's handshake ("Code: 115, Unknown setting
// client_protocol_version"); over the native protocol, SELECT and DDL work
// but Exec of an INSERT ... VALUES waits for a packet the server never
// sends (it ends only at the context's deadline) and PrepareBatch without
// a column list fails ("expected 0 arguments, got 11"). ClickHouse's HTTP
// interface is stable across versions and needs only the HTTP port.
type ClickHouse struct {
	base     *url.URL // without user information
	user     *url.Userinfo
	database string
	table    string
	client   *http.Client
}

var _ Sink = (*ClickHouse)(nil)

// ClickHouseConfig configures NewClickHouse.
type ClickHouseConfig struct {
	// URL is the server's HTTP interface, such as http://127.0.0.1:8123;
	// user information in it (http://user:password@host:8123) is sent as
	// HTTP basic authentication. Required.
	URL string
	// Database and Table name the table the rows go to, created if
	// missing. Empty means config.DefaultClickHouseDatabase and
	// config.DefaultClickHouseTable.
	Database string
	Table    string
	// Timeout bounds each request to the server; zero means
	// config.DefaultClickHouseTimeout.
	Timeout time.Duration
}

var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)

// NewClickHouse checks c and returns its sink. It does not contact the
// server: a server that is down or refuses the credentials shows in the
// shipper's rounds, never at start.
func NewClickHouse(c ClickHouseConfig) (*ClickHouse, error) {
	u, err := url.Parse(c.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("ClickHouse URL %q: want http://host:8123 or https://host:8443 (user information allowed, no query): %w",
			redactURL(c.URL), errdefs.ErrInvalidArgument)
	}
	if c.Database == "" {
		c.Database = config.DefaultClickHouseDatabase
	}
	if c.Table == "" {
		c.Table = config.DefaultClickHouseTable
	}
	for _, n := range []struct{ what, v string }{{"database", c.Database}, {"table", c.Table}} {
		if !identifier.MatchString(n.v) {
			return nil, fmt.Errorf("ClickHouse %s %q: want letters, digits and underscores, not starting with a digit, at most 64: %w",
				n.what, n.v, errdefs.ErrInvalidArgument)
		}
	}
	if c.Timeout <= 0 {
		c.Timeout = config.DefaultClickHouseTimeout
	}
	ch := &ClickHouse{user: u.User, database: c.Database, table: c.Table, client: &http.Client{Timeout: c.Timeout}}
	u.User = nil
	ch.base = u
	return ch, nil
}

// String names the server and table, without credentials, for logs.
func (c *ClickHouse) String() string { return c.base.String() + " table " + c.qualified() }

// qualified is the table's name in SQL; both parts are identifiers, so the
// backquotes need no escaping.
func (c *ClickHouse) qualified() string { return "`" + c.database + "`.`" + c.table + "`" }

// Schema returns the CREATE TABLE statement of the table. Its sorting key
// ends with the invocation id, and every other column of the key is a
// function of the id (an invocation's workspace and end never change), so
// ReplacingMergeTree keeps one row per invocation id: a batch sent twice
// (shipped, then the daemon stopped before it deleted the entries) is
// collapsed when the parts merge. Merges are eventual, so a query must
// deduplicate itself until then: SELECT ... FROM t FINAL, or GROUP BY id
// (the README's sample query).
func (c *ClickHouse) Schema() string {
	return `CREATE TABLE IF NOT EXISTS ` + c.qualified() + ` (
	id           String,
	execution_id String,
	workspace_id String,
	tool         String,
	runtime      String,
	status       String,
	driver       String,
	queued_us    Int64,
	ran_us       Int64,
	credits      Int64,
	ended_at     DateTime('UTC')
) ENGINE = ReplacingMergeTree()
PARTITION BY toYYYYMM(ended_at)
ORDER BY (workspace_id, ended_at, id)`
}

// Prepare implements Sink: it creates the database and the table if
// missing. An existing table is used as it is.
func (c *ClickHouse) Prepare(ctx context.Context) error {
	for _, q := range []string{"CREATE DATABASE IF NOT EXISTS `" + c.database + "`", c.Schema()} {
		if err := c.do(ctx, nil, strings.NewReader(q)); err != nil {
			return fmt.Errorf("creating %s: %w", c.qualified(), err)
		}
	}
	return nil
}

// Row is a tool_invocations row as the table holds it, in the JSONEachRow
// form in which it is inserted and read back.
type Row struct {
	ID          string `json:"id"`
	ExecutionID string `json:"execution_id"`
	WorkspaceID string `json:"workspace_id"`
	Tool        string `json:"tool"`
	Runtime     string `json:"runtime"`
	Status      string `json:"status"`
	Driver      string `json:"driver"`
	QueuedUS    int64  `json:"queued_us"`
	RanUS       int64  `json:"ran_us"`
	Credits     int64  `json:"credits"`
	// EndedAt is in ClickHouse's DateTime text form, in UTC like the
	// column: whole seconds.
	EndedAt string `json:"ended_at"`
}

// Insert implements Sink. The rows are sent in one request, which
// ClickHouse inserts as one block: all or none of them.
func (c *ClickHouse) Insert(ctx context.Context, rows []model.ToolInvocation) error {
	var body bytes.Buffer
	enc := json.NewEncoder(&body)
	for _, ti := range rows {
		if err := enc.Encode(Row{
			ID: ti.ID, ExecutionID: ti.ExecutionID, WorkspaceID: ti.WorkspaceID, Tool: ti.Tool, Runtime: ti.Runtime,
			Status: string(ti.Status), Driver: ti.Driver, QueuedUS: ti.Queued.Microseconds(), RanUS: ti.Ran.Microseconds(),
			Credits: ti.Credits, EndedAt: ti.CreatedAt.UTC().Format(time.DateTime),
		}); err != nil {
			return fmt.Errorf("encoding invocation %s: %w", ti.ID, err)
		}
	}
	q := url.Values{"query": {"INSERT INTO " + c.qualified() + " FORMAT JSONEachRow"}}
	if err := c.do(ctx, q, &body); err != nil {
		return fmt.Errorf("inserting %d rows into %s: %w", len(rows), c.qualified(), err)
	}
	return nil
}

// do POSTs body to the server with the query parameters q and classifies
// a failure: the server unreachable or failing (ErrUnavailable), the
// credentials refused (ErrPermissionDenied), the database or table missing
// (ErrNotFound), the statement refused (ErrFailedPrecondition).
func (c *ClickHouse) do(ctx context.Context, q url.Values, body io.Reader) error {
	u := *c.base
	u.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), body)
	if err != nil {
		return fmt.Errorf("building a request to ClickHouse at %s: %w: %w", c.base, err, errdefs.ErrInvalidArgument)
	}
	if c.user != nil {
		pw, _ := c.user.Password()
		req.SetBasicAuth(c.user.Username(), pw)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return fmt.Errorf("reaching ClickHouse at %s: %w: %w", c.base, err, errdefs.ErrUnavailable)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		_, err := io.Copy(io.Discard, resp.Body)
		if err != nil {
			return fmt.Errorf("reading ClickHouse's answer: %w: %w", err, errdefs.ErrUnavailable)
		}
		return nil
	}
	msg := firstLine(resp.Body)
	switch resp.StatusCode {
	case http.StatusUnauthorized, http.StatusForbidden:
		return fmt.Errorf("ClickHouse at %s refused the credentials (the user and password of analytics.clickhouse.url): %s: %w",
			c.base, msg, errdefs.ErrPermissionDenied)
	case http.StatusNotFound:
		return fmt.Errorf("ClickHouse at %s: %s: %w", c.base, msg, errdefs.ErrNotFound)
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return fmt.Errorf("ClickHouse at %s answered %s: %s: %w", c.base, resp.Status, msg, errdefs.ErrUnavailable)
	}
	return fmt.Errorf("ClickHouse at %s answered %s: %s: %w", c.base, resp.Status, msg, errdefs.ErrFailedPrecondition)
}

// firstLine reads the first line of an error answer, bounded: ClickHouse
// puts its error code and message there.
func firstLine(r io.Reader) string {
	sc := bufio.NewScanner(io.LimitReader(r, 4096))
	sc.Buffer(make([]byte, 0, 4096), 4096)
	if sc.Scan() {
		return strings.TrimSpace(sc.Text())
	}
	return "(no message)"
}

// redactURL hides a password in a URL.
func redactURL(s string) string {
	if u, err := url.Parse(s); err == nil {
		return u.Redacted()
	}
	return "(unparsable)"
}
