package devcloud

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// ProviderPrefix begins every dev instance's providerID; the rest is the instance's (and its
// Node's) name.
const ProviderPrefix = "coroner-dev://"

// Instance is one dev instance as its record says: the dev cluster (Python, `coroner dev-cluster
// instance`) writes the record, this provider only reads it. A record is replaced whole (written
// aside, then renamed), so a read never sees half of one.
type Instance struct {
	Name         string `json:"name"`
	ProviderID   string `json:"providerID"`
	InstanceType string `json:"instanceType"`
	Zone         string `json:"zone"`
	CapacityType string `json:"capacityType"`
	// State is "booting", "running" or "failed"; a terminated instance has no record.
	State string `json:"state"`
}

// Gone is true for an instance that no longer exists for Karpenter: one whose boot failed.
func (i Instance) Gone() bool { return i.State == "failed" }

// Control launches and terminates instances through the dev cluster's command, and reads their
// records.
type Control struct {
	// Command is the argv prefix of `coroner dev-cluster instance --dir DIR`.
	Command []string
	// Records is the directory of the instances' records.
	Records string
}

func nameOf(providerID string) (string, bool) {
	name, found := strings.CutPrefix(providerID, ProviderPrefix)
	return name, found && name != "" && !strings.ContainsAny(name, "/.")
}

func (c Control) run(ctx context.Context, args ...string) error {
	argv := append(append([]string{}, c.Command...), args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var output bytes.Buffer
	cmd.Stdout, cmd.Stderr = &output, &output
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", filepath.Base(argv[0]), strings.Join(args, " "), err, strings.TrimSpace(output.String()))
	}
	return nil
}

// Launch asks the dev cluster for instance NAME; it returns once the record exists (state booting),
// while the node boots in the background, as a cloud's instance does.
func (c Control) Launch(ctx context.Context, name, instanceType, zone, capacityType string) error {
	return c.run(ctx, "launch", "--name", name, "--provider-id", ProviderPrefix+name,
		"--instance-type", instanceType, "--zone", zone, "--capacity-type", capacityType)
}

// Terminate kills instance NAME at once (kubelet, containerd, shims, containers) and removes its
// record; terminating an instance that does not exist succeeds.
func (c Control) Terminate(ctx context.Context, name string) error {
	return c.run(ctx, "terminate", "--name", name)
}

// Get reads instance NAME's record; fs.ErrNotExist when it has none.
func (c Control) Get(name string) (Instance, error) {
	raw, err := os.ReadFile(filepath.Join(c.Records, name+".json"))
	if err != nil {
		return Instance{}, err
	}
	var instance Instance
	if err := json.Unmarshal(raw, &instance); err != nil {
		return Instance{}, fmt.Errorf("instance record %s: %w", name, err)
	}
	return instance, nil
}

// List reads every record.
func (c Control) List() ([]Instance, error) {
	entries, err := os.ReadDir(c.Records)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var instances []Instance
	for _, entry := range entries {
		name, isRecord := strings.CutSuffix(entry.Name(), ".json")
		if !isRecord || entry.IsDir() {
			continue
		}
		instance, err := c.Get(name)
		if errors.Is(err, fs.ErrNotExist) {
			continue // terminated between the listing and the read
		}
		if err != nil {
			return nil, err
		}
		instances = append(instances, instance)
	}
	return instances, nil
}
