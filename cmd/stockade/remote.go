package main

import (
	"flag"
	"os"

	"github.com/stockade-sh/stockade/client"
)

// remoteFlags are the flags of the commands that talk to a daemon: --url
// and --key, which default to STOCKADE_URL and STOCKADE_KEY.
type remoteFlags struct {
	url, key string
}

// register adds --url and --key to fs; urlHelp says what --url does.
func (r *remoteFlags) register(fs *flag.FlagSet, urlHelp string) {
	fs.StringVar(&r.url, "url", "", urlHelp+" (env STOCKADE_URL)")
	fs.StringVar(&r.key, "key", "", "API key of a workspace, an agent key to run code (env STOCKADE_KEY)")
}

// fromEnv fills what the flags left empty from the environment.
func (r *remoteFlags) fromEnv() {
	if r.url == "" {
		r.url = os.Getenv("STOCKADE_URL")
	}
	if r.key == "" {
		r.key = os.Getenv("STOCKADE_KEY")
	}
}

// client returns a client of the daemon; a missing key or a bad URL is bad
// input.
func (r *remoteFlags) client() (*client.Client, error) {
	if r.key == "" {
		return nil, usagef("no API key: give --key KEY or set STOCKADE_KEY (stockade key create --workspace NAME --role agent)")
	}
	c, err := client.New(r.url, r.key, client.WithUserAgent("stockade/"+version))
	if err != nil {
		return nil, usageError{err}
	}
	return c, nil
}
