package main

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"log/slog"

	"github.com/peterbourgon/ff/v3/ffcli"

	"github.com/pspnode/pspnode/node"
)

// privateJob reads --swarm-key and --allow-peers into cfg. With a key and
// no --listen, the default listen addresses shrink to their TCP ones.
func privateJob(cfg *node.Config, swarmKey, allowPeers string, listenSet bool, log *slog.Logger) error {
	if swarmKey != "" {
		key, err := node.ReadSwarmKey(swarmKey)
		if err != nil {
			return usagef("--swarm-key: %w", err)
		}
		cfg.PSK = key
		if !listenSet {
			var tcp []string
			for _, l := range cfg.Listen {
				if node.IsTCPAddr(l) {
					tcp = append(tcp, l)
				}
			}
			cfg.Listen = tcp
		}
		log.Info("private job (--swarm-key): only TCP transports run; QUIC, WebTransport and WebRTC cannot carry a pre-shared key")
	}
	if allowPeers != "" {
		ids, err := node.ReadAllowPeers(allowPeers)
		if err != nil {
			return usagef("--allow-peers: %w", err)
		}
		cfg.AllowPeers = ids
		log.Info("allowlist (--allow-peers): refusing every other peer", "peers", len(ids))
	}
	return nil
}

func keygenCommand(stdout, stderr io.Writer) *ffcli.Command {
	flags := newFlagSet("pspnode keygen", stderr)
	swarmKey := flags.String("swarm-key", "", "write a fresh swarm key (kubo's swarm.key format) to this file, with mode 0600; an existing file is never overwritten")
	return &ffcli.Command{
		Name:       "keygen",
		ShortUsage: "pspnode keygen --swarm-key FILE",
		ShortHelp:  "write a fresh swarm key for a private job (give every node of the job a copy)",
		FlagSet:    flags,
		Options:    envOptions(),
		Exec: func(_ context.Context, args []string) error {
			if len(args) > 0 {
				return usagef("keygen takes no arguments, got %q", args)
			}
			if *swarmKey == "" {
				return usagef("--swarm-key FILE is required")
			}
			if err := node.WriteSwarmKey(*swarmKey); err != nil {
				if errors.Is(err, fs.ErrExist) {
					return usagef("%s exists: refusing to overwrite a job's key (remove it first if you mean to)", *swarmKey)
				}
				return err
			}
			_, err := io.WriteString(stdout, "wrote "+*swarmKey+" (mode 0600): copy it to every node of the job, and pass --swarm-key\n")
			return err
		},
	}
}
