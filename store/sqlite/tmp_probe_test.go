package sqlite_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/store/sqlite"
)

func TestProbe(t *testing.T) {
	st, _ := sqlite.Open(t.Context(), sqlite.Config{Path: filepath.Join(t.TempDir(), "p.db")})
	defer st.Close()
	ctx := t.Context()
	ws, _ := st.CreateWorkspace(ctx, "p")
	k, _ := st.CreateAPIKey(ctx, store.NewAPIKey{WorkspaceID: ws.ID, Role: store.RoleAgent, Hash: store.HashKey("p")})
	st.GrantCredits(ctx, ws.ID, 1<<40, "")
	var c, s, f, e, g, raw time.Duration
	const n = 300
	for i := 0; i < n; i++ {
		t0 := time.Now()
		adm, err := st.CreateExecution(ctx, store.NewExecution{WorkspaceID: ws.ID, KeyID: k.ID, Runtime: "python", Tool: "x",
			Request: []byte(`{}`), InputSHA256: "0000000000000000000000000000000000000000000000000000000000000000", Credits: 2})
		if err != nil {
			t.Fatal(err)
		}
		t1 := time.Now()
		st.StartExecution(ctx, adm.Execution.ID, "runc")
		t2 := time.Now()
		st.FinishExecution(ctx, store.Outcome{ExecutionID: adm.Execution.ID, Status: store.StatusSucceeded})
		t3 := time.Now()
		st.AppendEvent(ctx, store.NewEvent{WorkspaceID: ws.ID, Type: "x"})
		t4 := time.Now()
		st.GetExecution(ctx, ws.ID, adm.Execution.ID)
		t5 := time.Now()
		st.UnsafeExec(ctx, "UPDATE credit_accounts SET available = available WHERE workspace_id = 'zz'")
		t6 := time.Now()
		c += t1.Sub(t0)
		s += t2.Sub(t1)
		f += t3.Sub(t2)
		e += t4.Sub(t3)
		g += t5.Sub(t4)
		raw += t6.Sub(t5)
	}
	t.Logf("create %v start %v finish %v append %v get %v rawexec %v", c/n, s/n, f/n, e/n, g/n, raw/n)
}
