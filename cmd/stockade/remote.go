package main

import (
	"flag"

	"github.com/stockade-sh/stockade/client"
)

// remoteFlags are the flags of the commands that talk to a daemon: --url
// and --key, which default to STOCKADE_URL and STOCKADE_KEY.
type remoteFlags struct {
	url, key string
	// urlFrom names where url came from, for messages: "--url" or
	// "STOCKADE_URL"; empty while url is.
	urlFrom string
}

// register adds --url and --key to fs; urlHelp says what --url does.
func (r *remoteFlags) register(fs *flag.FlagSet, urlHelp string) {
	fs.StringVar(&r.url, "url", "", urlHelp+" (env STOCKADE_URL)")
	fs.StringVar(&r.key, "key", "", "API key of a workspace, an agent key to run code (env STOCKADE_KEY)")
}

// fromEnv fills what the flags of fs left out from the environment: a flag
// given on the command line wins, even empty (--url "" is no daemon
// whatever STOCKADE_URL says). Every command that takes --url and --key
// calls it once its flags are parsed, and before it looks at r.url.
func (r *remoteFlags) fromEnv(fs *flag.FlagSet) {
	r.urlFrom = "--url"
	if !isSet(fs, "url") {
		r.urlFrom = "STOCKADE_URL"
	}
	flagOrEnv(fs, "url", "STOCKADE_URL", &r.url)
	flagOrEnv(fs, "key", "STOCKADE_KEY", &r.key)
	if r.url == "" {
		r.urlFrom = ""
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
