package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/stockade-sh/stockade/client"
	"github.com/stockade-sh/stockade/sandbox"
)

const sessionSnapshotUsage = `usage: stockade session snapshot ID [--name NAME] [--list] [--delete SNAPSHOT] [--url URL] [--key KEY] [--json]

Saves session ID's kernel state and /workspace, leaving it running (it stalls
while it is saved), and prints the snapshot's id on stdout; stockade session
create --snapshot SNAPSHOT starts a new session from it. A snapshot outlives
its session until it is deleted or expires. --list lists the session's
snapshots instead; --delete deletes one. Sessions on runc cannot be
snapshotted.`

func sessionSnapshot(ctx context.Context, args []string) int {
	var (
		name, del string
		list      bool
	)
	c, pos, asJSON, err := sessionVerbFlags("snapshot", sessionSnapshotUsage, args, 0, 1, func(fs *flag.FlagSet) {
		fs.StringVar(&name, "name", "", "a name for the snapshot")
		fs.BoolVar(&list, "list", false, "list the session's snapshots")
		fs.StringVar(&del, "delete", "", "delete this snapshot")
	})
	if err != nil {
		return report(err, asJSON)
	}
	switch {
	case del != "":
		if err := c.DeleteSnapshot(ctx, del); err != nil {
			return report(remoteErr(ctx, err), asJSON)
		}
		fmt.Fprintf(os.Stderr, "snapshot %s deleted\n", del)
		return 0
	case len(pos) != 1:
		return report(usagef("session snapshot: give the session's ID (stockade session snapshot --help)"), asJSON)
	case list:
		l, err := c.ListSnapshots(ctx, pos[0])
		if err != nil {
			return report(remoteErr(ctx, err), asJSON)
		}
		if asJSON {
			return reportErr(printJSON(l))
		}
		for _, s := range l {
			fmt.Printf("%s\t%s\t%s\texpires %s\n", s.ID, s.Name, sandbox.FormatSize(s.Bytes), s.ExpiresAt.Local().Format(time.DateTime))
		}
		return 0
	}
	s, err := c.SnapshotSession(ctx, pos[0], client.SnapshotRequest{Name: name})
	if err != nil {
		return report(remoteErr(ctx, err), asJSON)
	}
	if asJSON {
		return reportErr(printJSON(s))
	}
	fmt.Println(s.ID)
	fmt.Fprintf(os.Stderr, "snapshot %s of session %s: %s, the session stalled %d ms\n", s.ID, s.SessionID, sandbox.FormatSize(s.Bytes), s.StallMS)
	return 0
}

const sessionForkUsage = `usage: stockade session fork ID [--count N] [--url URL] [--key KEY] [--json]

Starts N new sessions (default 1) from session ID's current kernel state and
/workspace, all of them or none, and prints their ids on stdout, one a line.
Each is a session of its own: nothing one does reaches the source or the
others, and each draws its own random numbers. Sessions on runc cannot fork.`

func sessionFork(ctx context.Context, args []string) int {
	var count int
	c, pos, asJSON, err := sessionVerbFlags("fork", sessionForkUsage, args, 1, 1, func(fs *flag.FlagSet) {
		fs.IntVar(&count, "count", 1, "how many sessions to start")
	})
	if err != nil {
		return report(err, asJSON)
	}
	f, err := c.ForkSession(ctx, pos[0], client.ForkRequest{Count: count})
	if err != nil {
		return report(remoteErr(ctx, err), asJSON)
	}
	if asJSON {
		return reportErr(printJSON(f))
	}
	for _, s := range f.Sessions {
		fmt.Println(s.ID)
	}
	fmt.Fprintf(os.Stderr, "%d fork(s) of session %s; the source stalled %d ms\n", len(f.Sessions), f.SourceID, f.StallMS)
	return 0
}
