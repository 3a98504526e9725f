package main

import (
	"flag"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/peterbourgon/ff/v3/ffcli"

	"github.com/pspnode/pspnode/psp"
)

func TestFloatFlag(t *testing.T) {
	for _, tc := range []struct {
		make func(float64) floatFlag
		in   string
		want float64 // after Set, when err is ""
		err  string  // Set's error, exactly
	}{
		{shareFlag, "1", 1, ""},
		{shareFlag, "0.25", 0.25, ""},
		{shareFlag, "0", 0, `"0" is not a share in (0, 1]`},
		{shareFlag, "1.5", 0, `"1.5" is not a share in (0, 1]`},
		{shareFlag, "NaN", 0, `"NaN" is not a share in (0, 1]`},
		{fractionFlag, "0", 0, ""},
		{fractionFlag, "1", 1, ""},
		{fractionFlag, "-0.1", 0, `"-0.1" is not a fraction in [0, 1]`},
		{fractionFlag, "2", 0, `"2" is not a fraction in [0, 1]`},
		{fractionFlag, "x", 0, `"x" is not a fraction in [0, 1]`},
		{positiveFlag, "1e-9", 1e-9, ""},
		{positiveFlag, "1e300", 1e300, ""},
		{positiveFlag, "0", 0, `"0" is not a positive number`},
		{positiveFlag, "+Inf", 0, `"+Inf" is not a positive number`},
		{positiveFlag, "1e400", 0, `"1e400" is not a positive number`},
		{nonNegativeFlag, "0", 0, ""},
		{nonNegativeFlag, "2.5", 2.5, ""},
		{nonNegativeFlag, "-1", 0, `"-1" is not a number >= 0`},
		{nonNegativeFlag, "Inf", 0, `"Inf" is not a number >= 0`},
		{nonNegativeFlag, "nan", 0, `"nan" is not a number >= 0`},
	} {
		f := tc.make(0.5)
		err := f.Set(tc.in)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%s: Set(%q): %v", f.want, tc.in, err)
		case tc.err == "" && f.x != tc.want:
			t.Errorf("%s: Set(%q) gave %v, want %v", f.want, tc.in, f.x, tc.want)
		case tc.err != "" && (err == nil || err.Error() != tc.err):
			t.Errorf("%s: Set(%q): error %v, want %q", f.want, tc.in, err, tc.err)
		case tc.err != "" && f.x != 0.5:
			t.Errorf("%s: Set(%q) failed but changed the value to %v", f.want, tc.in, f.x)
		}
	}
}

// A bad value is a parse error naming the flag; the default shows in help.
func TestFloatFlagInFlagSet(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	share := shareFlag(0.25)
	fs.Var(&share, "poll-share", "help")
	if got := fs.Lookup("poll-share").DefValue; got != "0.25" {
		t.Errorf("default %q, want 0.25", got)
	}
	err := fs.Parse([]string{"--poll-share", "0"})
	want := `invalid value "0" for flag -poll-share: "0" is not a share in (0, 1]`
	if err == nil || err.Error() != want {
		t.Errorf("Parse: %v, want %q", err, want)
	}
}

// Every command that takes --barrier lists every kind of psp's table in
// its long help and its grammar in the flag's help, and refuses a bad spec
// with psp's error, which shows the grammar.
func TestBarrierHelpFromKindsTable(t *testing.T) {
	for _, cmd := range []*ffcli.Command{runCommand(io.Discard, io.Discard), simCommand(io.Discard, io.Discard), testnetCommand(io.Discard, io.Discard)} {
		for _, k := range psp.Kinds() {
			if line := k.Form() + "  "; !strings.Contains(cmd.LongHelp, line) || !strings.Contains(cmd.LongHelp, k.Help) {
				t.Errorf("%s: the long help lacks %q and its help", cmd.Name, k.Form())
			}
		}
		f := cmd.FlagSet.Lookup("barrier")
		if f == nil || !strings.Contains(f.Usage, psp.Grammar) {
			t.Fatalf("%s: --barrier's help lacks the grammar", cmd.Name)
		}
		err := f.Value.Set("pssp:1")
		if err == nil || !strings.Contains(err.Error(), "write pssp:B:S") || !strings.Contains(err.Error(), psp.Grammar) {
			t.Errorf("%s: --barrier pssp:1: %v", cmd.Name, err)
		}
	}
	if !strings.Contains(paceHelp, "the pace rule of pbsp and pssp checks") {
		t.Errorf("--pace's help names other kinds: %q", paceHelp)
	}
}

// The README's barrier table and cli.md's grammar name every kind of psp's
// table: a new kind fails here until the docs say how to write it.
func TestBarrierDocsListEveryKind(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	cli, err := os.ReadFile("../../docs/cli.md")
	if err != nil {
		t.Fatal(err)
	}
	// cli.md wraps its lines: compare with single spaces.
	cliText := strings.Join(strings.Fields(string(cli)), " ")
	for _, k := range psp.Kinds() {
		if row := "| `" + k.Form() + "` |"; !strings.Contains(string(readme), row) {
			t.Errorf("README.md's barrier table has no row %q", row)
		}
		if !strings.Contains(cliText, "`"+k.Form()+"`") {
			t.Errorf("docs/cli.md's barrier grammar lacks `%s`", k.Form())
		}
	}
}
