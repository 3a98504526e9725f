package main

import (
	"encoding/json"
	"flag"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// The files in deploy/ run pspnode with flags; every flag they name must
// exist in that subcommand's FlagSet, or a deployment fails at start.

// subcommandFlags maps each subcommand to its flag set.
func subcommandFlags() map[string]*flag.FlagSet {
	out := make(map[string]*flag.FlagSet)
	for _, c := range rootCommand(io.Discard, io.Discard).Subcommands {
		out[c.Name] = c.FlagSet
	}
	return out
}

var (
	// A shell command on one line: pspnode <subcommand> [args], up to a
	// pipe, ';' or '&'.
	shellLine = regexp.MustCompile(`(?:^|[\s/"'])pspnode\s+([a-z]+)\b([^|;&]*)`)
	// A YAML key whose value is a command line as a list.
	listKey  = regexp.MustCompile(`^(\s*)(?:-\s+)?(command|args):\s*(.*)$`)
	listItem = regexp.MustCompile(`^(\s*)-\s+(.*)$`)
	// A Dockerfile ENTRYPOINT or CMD in exec (JSON) form.
	execForm = regexp.MustCompile(`^(ENTRYPOINT|CMD)\s+(\[.*\])\s*$`)
)

// deployFlagErrors returns one message per flag in content that its
// subcommand lacks, and per command list naming no known subcommand; and
// how many flags it checked.
func deployFlagErrors(name, content string, cmds map[string]*flag.FlagSet) (errs []string, checked int) {
	check := func(where string, args []string) {
		if len(args) > 0 && (args[0] == "pspnode" || strings.HasSuffix(args[0], "/pspnode")) {
			args = args[1:]
		}
		hasFlags := false
		for _, a := range args {
			hasFlags = hasFlags || strings.HasPrefix(a, "--")
		}
		if len(args) == 0 {
			return
		}
		fs, ok := cmds[args[0]]
		if !ok {
			if hasFlags {
				errs = append(errs, where+": "+args[0]+" is not a pspnode subcommand")
			}
			return
		}
		for _, a := range args[1:] {
			a = strings.Trim(a, `"',`)
			if !strings.HasPrefix(a, "--") {
				continue
			}
			f, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
			checked++
			if fs.Lookup(f) == nil {
				errs = append(errs, where+": pspnode "+args[0]+" has no flag --"+f)
			}
		}
	}
	lines := strings.Split(content, "\n")
	var entrypoint []string
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		where := name + ":" + strconv.Itoa(i+1)
		for _, m := range shellLine.FindAllStringSubmatch(line, -1) {
			if _, ok := cmds[m[1]]; ok {
				check(where, append([]string{m[1]}, strings.Fields(m[2])...))
			}
		}
		if m := execForm.FindStringSubmatch(line); m != nil {
			var list []string
			if err := json.Unmarshal([]byte(m[2]), &list); err != nil {
				errs = append(errs, where+": "+err.Error())
				continue
			}
			if m[1] == "ENTRYPOINT" {
				entrypoint = list
			} else {
				check(where, append(append([]string(nil), entrypoint...), list...))
			}
			continue
		}
		m := listKey.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		var list []string
		if v := strings.TrimSpace(m[3]); strings.HasPrefix(v, "[") {
			for _, it := range strings.Split(strings.Trim(v, "[]"), ",") {
				list = append(list, strings.Trim(strings.TrimSpace(it), `"'`))
			}
		} else if v == "" {
			for i+1 < len(lines) {
				it := listItem.FindStringSubmatch(lines[i+1])
				if it == nil || len(it[1]) < len(m[1]) {
					break
				}
				list = append(list, strings.Trim(strings.TrimSpace(it[2]), `"'`))
				i++
			}
		}
		check(where, list)
	}
	return errs, checked
}

func TestDeployFilesUseExistingFlags(t *testing.T) {
	cmds := subcommandFlags()
	var files []string
	err := filepath.WalkDir(filepath.Join("..", "..", "deploy"), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			files = append(files, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 3 {
		t.Fatalf("deploy/ holds %v: want the Dockerfile, the compose file and the Kubernetes manifests", files)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		errs, n := deployFlagErrors(f, string(b), cmds)
		for _, e := range errs {
			t.Error(e)
		}
		t.Logf("%s: %d flags checked", f, n)
		if n == 0 && filepath.Ext(f) != ".json" { // the Grafana dashboard runs nothing
			t.Errorf("%s: no pspnode flags found", f)
		}
	}
}

// The checker itself catches a flag that does not exist, in each form.
func TestDeployFlagCheckerCatchesUnknownFlags(t *testing.T) {
	cmds := subcommandFlags()
	for _, tc := range []struct{ name, content string }{
		{"shell", "#   pspnode run --job x --no-such-flag 1\n"},
		{"dockerfile", "ENTRYPOINT [\"/pspnode\"]\nCMD [\"run\", \"--no-such-flag\"]\n"},
		{"yaml block", "    command:\n      - run\n      - --job=x\n      - --no-such-flag=1\n"},
		{"yaml flow", "  args: [\"run\", \"--no-such-flag\"]\n"},
		{"wrong subcommand", "#  pspnode keygen --identity x\n"},
		{"unknown subcommand", "    args:\n      - rnu\n      - --job=x\n"},
	} {
		if errs, _ := deployFlagErrors(tc.name, tc.content, cmds); len(errs) != 1 {
			t.Errorf("%s: errors %q, want one", tc.name, errs)
		}
	}
	ok := "    args:\n      - run\n      - --job=x\n      - --bootstrap=/dns4/b/tcp/4001/p2p/$(BOOT_ID)\n    command: [\"sh\", \"-c\", \"true\"]\n"
	if errs, n := deployFlagErrors("ok", ok, cmds); len(errs) != 0 || n != 2 {
		t.Errorf("valid flags: %d checked, errors %q; want 2 and none", n, errs)
	}
}
