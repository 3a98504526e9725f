package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/peterbourgon/ff/v3"
	"github.com/peterbourgon/ff/v3/ffcli"

	"github.com/pspnode/pspnode/node"
)

// version is set at build time by `make dist` (-X main.version=...).
var version string

// buildVersion is version, or without it the module version from the Go
// build information ("devel" for a plain go build in the repository).
func buildVersion() string {
	if version != "" {
		return version
	}
	return node.Version()
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run is main without the process: it returns the exit code (0 ok, 1 the
// job failed, 2 bad usage).
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := rootCommand(stdout, stderr)
	asked := quietUsage(root)
	if err := root.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			if *asked != nil {
				fmt.Fprintln(stderr, ffcli.DefaultUsageFunc(*asked))
			}
			return 0
		}
		fmt.Fprintf(stderr, "pspnode: %v\n", err)
		if *asked != nil {
			fmt.Fprintf(stderr, "run '%s --help' for every flag\n", (*asked).FlagSet.Name())
		}
		return 2
	}
	return exitCode(root.Run(ctx), stderr)
}

// quietUsage stops the flag package from printing anything while it
// parses: on a bad flag it prints the error and then the whole help page,
// which buries the one line that matters. run prints the error (once) with
// a pointer to --help instead, and the help page only when it was asked
// for. The returned pointer is set to the command whose flags were parsed
// last when the flag package asked for its usage.
func quietUsage(root *ffcli.Command) **ffcli.Command {
	var asked *ffcli.Command
	var walk func(c *ffcli.Command)
	walk = func(c *ffcli.Command) {
		c.FlagSet.SetOutput(io.Discard)
		c.UsageFunc = func(c *ffcli.Command) string {
			asked = c
			return ""
		}
		for _, sub := range c.Subcommands {
			walk(sub)
		}
	}
	walk(root)
	return &asked
}

// exitCode prints err, if any, and returns the exit code for it: 0 for
// none, 2 for a usage error, 1 for a failed job.
func exitCode(err error, stderr io.Writer) int {
	if err == nil {
		return 0
	}
	fmt.Fprintf(stderr, "pspnode: %v\n", err)
	var u usageError
	if errors.As(err, &u) {
		return 2
	}
	return 1
}

// usageError marks errors in what the user asked for (exit code 2).
type usageError struct{ error }

func usagef(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }

func rootCommand(stdout, stderr io.Writer) *ffcli.Command {
	fs := flag.NewFlagSet("pspnode", flag.ContinueOnError)
	fs.SetOutput(stderr)
	root := &ffcli.Command{
		Name:       "pspnode",
		ShortUsage: "pspnode <subcommand> [flags]",
		LongHelp: `pspnode trains a model across peers with no central server, deciding each
step with a probabilistic barrier (pBSP/pSSP) over a small random sample of
peers. Run 'pspnode <subcommand> --help' for the flags of each subcommand.`,
		FlagSet: fs,
		Subcommands: []*ffcli.Command{
			runCommand(stdout, stderr),
			idCommand(stdout, stderr),
			keygenCommand(stdout, stderr),
			testnetCommand(stdout, stderr),
			simCommand(stdout, stderr),
			boundCommand(stdout, stderr),
			{
				Name:       "version",
				ShortUsage: "pspnode version",
				ShortHelp:  "print the version",
				FlagSet:    newFlagSet("pspnode version", stderr),
				Exec: func(context.Context, []string) error {
					_, err := fmt.Fprintln(stdout, "pspnode", buildVersion())
					return err
				},
			},
		},
	}
	root.Exec = func(_ context.Context, args []string) error {
		fmt.Fprint(stderr, ffcli.DefaultUsageFunc(root))
		if len(args) > 0 {
			return usagef("unknown subcommand %q", args[0])
		}
		return usagef("no subcommand given")
	}
	return root
}

// newFlagSet returns a flag set whose help goes to stderr.
func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// envOptions lets every flag also be set as PSPNODE_<FLAG> (dashes become
// underscores), so deployments can configure nodes from the environment.
func envOptions() []ff.Option { return []ff.Option{ff.WithEnvVarPrefix("PSPNODE")} }
