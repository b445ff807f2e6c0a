package main

import (
	"flag"
	"os"
	"strings"
	"time"

	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/sandbox"
)

// configOption changes what configFlags registers.
type configOption int

const (
	// withConfigFile adds --config FILE, the YAML configuration file.
	withConfigFile configOption = 1 << iota
	// withoutSandboxFlags leaves out the flags of commands that run
	// sandboxes (--state-dir, --runc, --runsc, --guest, --docker-host).
	withoutSandboxFlags
)

// configFlags registers the flags shared by the subcommands that read the
// configuration, bound to a Config that starts from config.Default(). Call
// load with the arguments instead of fs.Parse: it returns the positional
// arguments and applies, in order of precedence from low to high,
// the defaults, the --config file (withConfigFile), the environment
// (STOCKADE_DATA_DIR, STOCKADE_STATE_DIR, STOCKADE_DRIVER,
// SANDBOX_DRIVER as an alias of STOCKADE_DRIVER, DOCKER_HOST, the vercel
// driver's VERCEL_TOKEN, VERCEL_TEAM_ID, VERCEL_PROJECT_ID and
// STOCKADE_VERCEL_API, the modal driver's MODAL_TOKEN_ID,
// MODAL_TOKEN_SECRET, MODAL_ENVIRONMENT and MODAL_SERVER_URL, the
// kubernetes driver's STOCKADE_KUBECONFIG, STOCKADE_KUBERNETES_NAMESPACE,
// STOCKADE_KUBERNETES_GVISOR_CLASS, STOCKADE_KUBERNETES_CONTAINER_CLASS
// and STOCKADE_KUBERNETES_SECCOMP_DIR,
// STOCKADE_DB, STOCKADE_AUDIT_WITNESS, STOCKADE_ANALYTICS_CLICKHOUSE_URL)
// and the flags
// given.
// The environment is read here, in flagOrEnv and defaultDataDir, and
// nowhere else below cmd/.
func configFlags(fs *flag.FlagSet, opts ...configOption) (*config.Config, func(args []string) ([]string, error)) {
	var o configOption
	for _, x := range opts {
		o |= x
	}
	cfg := config.Default()
	fs.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "directory for images, database and binaries (env STOCKADE_DATA_DIR)")
	if o&withoutSandboxFlags == 0 {
		fs.StringVar(&cfg.StateDir, "state-dir", cfg.StateDir, "directory for runtime state, a tmpfs such as /run (env STOCKADE_STATE_DIR)")
		fs.StringVar(&cfg.RuncPath, "runc", cfg.RuncPath, "runc executable")
		fs.StringVar(&cfg.RunscPath, "runsc", cfg.RunscPath, "runsc executable")
		fs.StringVar(&cfg.GuestPath, "guest", cfg.GuestPath, "guest agent binary (default: the one embedded in stockade)")
		fs.StringVar(&cfg.DockerHost, "docker-host", cfg.DockerHost, "Docker Engine for the docker driver (env DOCKER_HOST; default the Docker client's)")
		kubernetesFlags(fs, &cfg.Kubernetes)
	}
	configFile := ""
	if o&withConfigFile != 0 {
		fs.StringVar(&configFile, "config", "", "YAML configuration `FILE`")
	}
	load := func(args []string) ([]string, error) {
		if _, err := parseArgs(fs, args); err != nil {
			return nil, usageError{err}
		}
		if configFile != "" {
			if err := cfg.LoadFile(configFile); err != nil {
				return nil, usageError{err}
			}
		}
		for _, e := range []struct {
			name string
			dst  *string
		}{
			{"STOCKADE_DATA_DIR", &cfg.DataDir}, {"STOCKADE_STATE_DIR", &cfg.StateDir},
			{"SANDBOX_DRIVER", &cfg.Driver}, {"STOCKADE_DRIVER", &cfg.Driver},
			{"DOCKER_HOST", &cfg.DockerHost}, {"STOCKADE_AUDIT_WITNESS", &cfg.AuditWitness},
			// As the admin commands read it (flagOrEnv): a URL with a
			// password stays off the daemon's command line.
			{"STOCKADE_DB", &cfg.DB},
			{"VERCEL_TOKEN", &cfg.Vercel.Token}, {"VERCEL_TEAM_ID", &cfg.Vercel.TeamID},
			{"VERCEL_PROJECT_ID", &cfg.Vercel.ProjectID}, {"STOCKADE_VERCEL_API", &cfg.Vercel.API},
			{"MODAL_TOKEN_ID", &cfg.Modal.TokenID}, {"MODAL_TOKEN_SECRET", &cfg.Modal.TokenSecret},
			{"MODAL_ENVIRONMENT", &cfg.Modal.Environment}, {"MODAL_SERVER_URL", &cfg.Modal.API},
			{"STOCKADE_ANALYTICS_CLICKHOUSE_URL", &cfg.Analytics.ClickHouse.URL},
			{"STOCKADE_KUBECONFIG", &cfg.Kubernetes.Kubeconfig}, {"STOCKADE_KUBERNETES_NAMESPACE", &cfg.Kubernetes.Namespace},
			{"STOCKADE_KUBERNETES_GVISOR_CLASS", &cfg.Kubernetes.GVisorClass},
			{"STOCKADE_KUBERNETES_CONTAINER_CLASS", &cfg.Kubernetes.ContainerClass},
			{"STOCKADE_KUBERNETES_SECCOMP_DIR", &cfg.Kubernetes.SeccompDir},
			{"STOCKADE_KUBERNETES_REGISTRY", &cfg.Kubernetes.Registry},
		} {
			if v := os.Getenv(e.name); v != "" {
				*e.dst = v
			}
		}
		// Parsing again re-applies the flags given over the file and the
		// environment; flags not given keep what those set.
		pos, err := parseArgs(fs, args)
		if err != nil {
			return nil, usageError{err}
		}
		return pos, nil
	}
	return &cfg, load
}

// kubernetesFlags registers the flags of the kubernetes driver, over k.
func kubernetesFlags(fs *flag.FlagSet, k *config.Kubernetes) {
	fs.StringVar(&k.Kubeconfig, "kubernetes-kubeconfig", k.Kubeconfig, "kubeconfig `FILE` of the kubernetes driver's cluster (env STOCKADE_KUBECONFIG; default the in-cluster configuration)")
	fs.StringVar(&k.Namespace, "kubernetes-namespace", k.Namespace, "namespace of the kubernetes driver's pods (env STOCKADE_KUBERNETES_NAMESPACE)")
	fs.StringVar(&k.GVisorClass, "kubernetes-gvisor-class", k.GVisorClass, "RuntimeClass of the kubernetes driver's gvisor-tier pods (env STOCKADE_KUBERNETES_GVISOR_CLASS)")
	fs.StringVar(&k.ContainerClass, "kubernetes-container-class", k.ContainerClass, "RuntimeClass of the kubernetes driver's container-tier pods (env STOCKADE_KUBERNETES_CONTAINER_CLASS; default the cluster's default runtime)")
	fs.StringVar(&k.SeccompDir, "kubernetes-seccomp-dir", k.SeccompDir, "the kubelet's seccomp `DIR`: the daemon writes Stockade's filters there and pods load them (env STOCKADE_KUBERNETES_SECCOMP_DIR; default the runtime's filter)")
	fs.StringVar(&k.Registry, "kubernetes-registry", k.Registry, "`REGISTRY`[/PREFIX] the nodes pull the images from by digest, pushed there by `stockade image push` (env STOCKADE_KUBERNETES_REGISTRY; default images imported on each node); the daemon asks it for each image's digest, with STOCKADE_REGISTRY_USERNAME and STOCKADE_REGISTRY_PASSWORD")
	fs.BoolVar(&k.RegistryInsecure, "kubernetes-registry-insecure", k.RegistryInsecure, "ask --kubernetes-registry over plain http, not https (a registry the nodes pull from over http)")
}

// defaultDataDir is the default of --data-dir for commands that take only
// it: STOCKADE_DATA_DIR, else the configuration's default. A --data-dir
// given wins, as flagOrEnv has it.
func defaultDataDir() string {
	if v := os.Getenv("STOCKADE_DATA_DIR"); v != "" {
		return v
	}
	return config.Default().DataDir
}

// flagOrEnv sets *dst to the environment variable env when flag name was
// not given on the command line of fs and env is set and not empty: a flag
// given wins over the environment, even when it is given its default. It
// is how the commands outside configFlags read the variables their help
// names (env X).
func flagOrEnv(fs *flag.FlagSet, name, env string, dst *string) {
	if isSet(fs, name) {
		return
	}
	if v := os.Getenv(env); v != "" {
		*dst = v
	}
}

// toolsFlag registers --tools FILE|DIR on fs: the tools file or directory,
// which replaces tools a configuration file names or lists.
func toolsFlag(fs *flag.FlagSet, cfg *config.Config) {
	fs.Var(toolsValue{cfg}, "tools", "tools `FILE|DIR`: a YAML file, or a directory of them, defining tools and their isolation records (default: the configuration's, else only the built-in code.execute)")
}

// templatesFlag registers --templates FILE|DIR on fs: the templates file
// or directory, which replaces templates a configuration file names or
// lists.
func templatesFlag(fs *flag.FlagSet, cfg *config.Config) {
	fs.Var(templatesValue{cfg}, "templates", "templates `FILE|DIR`: a YAML file, or a directory of them, declaring the templates tools name (default: the configuration's, else none)")
}

type templatesValue struct{ cfg *config.Config }

func (v templatesValue) String() string {
	if v.cfg == nil {
		return ""
	}
	return v.cfg.Templates
}

func (v templatesValue) Set(s string) error { v.cfg.SetTemplates(s); return nil }

type toolsValue struct{ cfg *config.Config }

func (v toolsValue) String() string {
	if v.cfg == nil {
		return ""
	}
	return v.cfg.Tools
}

func (v toolsValue) Set(s string) error { v.cfg.SetTools(s); return nil }

// durationFlag registers a duration flag read with sandbox.ParseDuration,
// the parser of every duration Stockade reads (30s, 2m, 1m30s, 2 min).
func durationFlag(fs *flag.FlagSet, p *time.Duration, name string, value time.Duration, usage string) {
	*p = value
	fs.Var((*durationValue)(p), name, usage)
}

type durationValue time.Duration

func (d *durationValue) String() string {
	if d == nil || *d == 0 {
		return ""
	}
	return sandbox.FormatDuration(time.Duration(*d))
}

func (d *durationValue) Set(s string) error {
	v, err := sandbox.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = durationValue(v)
	return nil
}

// parseArgs parses args with fs, allowing flags after positional arguments
// (`stockade credits grant demo 10 --db URL`), and returns the positional
// arguments. "--" ends flag parsing; "-" and negative numbers ("-5") are
// positional arguments, so that a command can refuse them in words.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var flags, pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			pos = append(pos, args[i+1:]...)
			break
		}
		if a == "-" || !strings.HasPrefix(a, "-") || isNegativeNumber(a) {
			pos = append(pos, a)
			continue
		}
		flags = append(flags, a)
		// A flag that takes a value and was not given one with "=" takes
		// the next argument, whatever it looks like (`-c -1`).
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if f := fs.Lookup(name); f != nil && !hasValue && !isBoolFlag(f) && i+1 < len(args) {
			i++
			flags = append(flags, args[i])
		}
	}
	if err := fs.Parse(flags); err != nil {
		return nil, err
	}
	return pos, nil
}

// isNegativeNumber reports whether a looks like "-5" or "-0.5": no flag
// name starts with a digit.
func isNegativeNumber(a string) bool { return len(a) > 1 && a[1] >= '0' && a[1] <= '9' }

func isBoolFlag(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}
