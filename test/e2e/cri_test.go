package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/forkvisor/forkvisor/internal/ctrd"
	"github.com/forkvisor/forkvisor/internal/ociimage"
	"github.com/forkvisor/forkvisor/internal/prereq"
)

const (
	pauseImage   = "forkvisor.local/pause:cri"
	tickCRIImage = "forkvisor.local/tick:cri"
)

// criNode is a private containerd with its CRI plugin and a "runsc"
// runtime handler, and CRI clients as a kubelet would hold them.
type criNode struct {
	c     *ctrd.Containerd
	rt    runtime.RuntimeServiceClient
	img   runtime.ImageServiceClient
	dir   string
	close func()
}

func startCRINode(t *testing.T) *criNode {
	t.Helper()
	ctrdBin := containerdBin(t)
	cniBin := filepath.Join(repoRoot, "build", "cni", "usr", "lib", "cni")
	if _, err := os.Stat(filepath.Join(cniBin, "loopback")); err != nil {
		prereq.Missing(t, "Debian's CNI plugins not fetched (tools/cni.sh, run by `make test`): %v", err)
	}
	dir := t.TempDir()
	c, err := ctrd.Start(dir, ctrdBin, filepath.Join(repoRoot, "bin"), &ctrd.CRI{SandboxImage: pauseImage, CNIBinDir: cniBin})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	// Images come from tarballs, not a registry, into CRI's namespace.
	for ref, bin := range map[string]string{pauseImage: pauseBin, tickCRIImage: tickBin} {
		tar := filepath.Join(dir, strings.NewReplacer("/", "_", ":", "_").Replace(ref)+".tar")
		f, err := os.Create(tar)
		if err != nil {
			t.Fatal(err)
		}
		var args []string
		if ref == tickCRIImage {
			args = []string{"-mib", "8", "-interval", "50ms"}
		}
		if err := ociimage.Write(f, ref, bin, args...); err != nil {
			t.Fatal(err)
		}
		f.Close()
		if out, err := c.Ctr("-n", "k8s.io", "images", "import", tar); err != nil {
			t.Fatalf("ctr images import %s: %v: %s", ref, err, out)
		}
	}
	conn, err := grpc.NewClient("unix://"+c.Socket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &criNode{c: c, rt: runtime.NewRuntimeServiceClient(conn), img: runtime.NewImageServiceClient(conn), dir: dir}
}

// TestCRIPodLifecycle drives containerd's CRI plugin as the kubelet would,
// with the runsc runtime handler: a pod sandbox with two containers, exec
// with exit codes and output, status, logs, stop and removal.
func TestCRIPodLifecycle(t *testing.T) {
	n := startCRINode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	ver, err := n.rt.Version(ctx, &runtime.VersionRequest{})
	if err != nil {
		t.Fatalf("CRI Version: %v", err)
	}
	t.Logf("CRI runtime %s %s, API %s", ver.RuntimeName, ver.RuntimeVersion, ver.RuntimeApiVersion)
	if imgs, err := n.img.ListImages(ctx, &runtime.ListImagesRequest{}); err != nil || !hasImage(imgs.Images, tickCRIImage) {
		t.Fatalf("CRI ListImages: %v; want the imported %s", err, tickCRIImage)
	}

	logDir := filepath.Join(n.dir, "pod-logs")
	podCfg := &runtime.PodSandboxConfig{
		Metadata:     &runtime.PodSandboxMetadata{Name: "fv-pod", Uid: "fv-pod-uid", Namespace: "default"},
		Hostname:     "fv-pod",
		LogDirectory: logDir,
		Linux:        &runtime.LinuxPodSandboxConfig{},
	}
	pod, err := n.rt.RunPodSandbox(ctx, &runtime.RunPodSandboxRequest{Config: podCfg, RuntimeHandler: ctrd.RuntimeHandler})
	if err != nil {
		t.Fatalf("RunPodSandbox: %v", err)
	}
	podID := pod.PodSandboxId
	ps, err := n.rt.PodSandboxStatus(ctx, &runtime.PodSandboxStatusRequest{PodSandboxId: podID})
	if err != nil || ps.Status.State != runtime.PodSandboxState_SANDBOX_READY {
		t.Fatalf("PodSandboxStatus: %v, %v; want ready", ps, err)
	}
	if h := ps.Status.GetRuntimeHandler(); h != ctrd.RuntimeHandler {
		t.Errorf("pod runtime handler %q, want %q", h, ctrd.RuntimeHandler)
	}
	if ip := ps.Status.GetNetwork().GetIp(); !strings.HasPrefix(ip, "10.88.77.") {
		t.Errorf("pod IP %q; want one from the test's bridge network 10.88.77.0/24", ip)
	}

	var ids []string
	for _, name := range []string{"tick-a", "tick-b"} {
		cc, err := n.rt.CreateContainer(ctx, &runtime.CreateContainerRequest{
			PodSandboxId: podID,
			Config: &runtime.ContainerConfig{
				Metadata: &runtime.ContainerMetadata{Name: name},
				Image:    &runtime.ImageSpec{Image: tickCRIImage},
				LogPath:  name + ".log",
				Linux:    &runtime.LinuxContainerConfig{},
			},
			SandboxConfig: podCfg,
		})
		if err != nil {
			t.Fatalf("CreateContainer %s: %v", name, err)
		}
		if _, err := n.rt.StartContainer(ctx, &runtime.StartContainerRequest{ContainerId: cc.ContainerId}); err != nil {
			t.Fatalf("StartContainer %s: %v", name, err)
		}
		ids = append(ids, cc.ContainerId)
	}

	for i, id := range ids {
		st, err := n.rt.ContainerStatus(ctx, &runtime.ContainerStatusRequest{ContainerId: id})
		if err != nil || st.Status.State != runtime.ContainerState_CONTAINER_RUNNING {
			t.Fatalf("ContainerStatus %d: %v, %v; want running", i, st, err)
		}
		// Exec: output and exit code. runsc's netstack has the pod's
		// interfaces, which CNI set up: eth0 on the bridge, and lo.
		ex, err := n.rt.ExecSync(ctx, &runtime.ExecSyncRequest{ContainerId: id, Cmd: []string{"/workload", "-cat", "/proc/net/dev"}, Timeout: 30})
		if err != nil || ex.ExitCode != 0 || !strings.Contains(string(ex.Stdout), "lo:") || !strings.Contains(string(ex.Stdout), "eth0:") {
			t.Errorf("ExecSync cat /proc/net/dev in container %d: %v, exit %d, stdout %q, stderr %q", i, err, ex.GetExitCode(), ex.GetStdout(), ex.GetStderr())
		}
		ex, err = n.rt.ExecSync(ctx, &runtime.ExecSyncRequest{ContainerId: id, Cmd: []string{"/workload", "-cat", "/nonexistent"}, Timeout: 30})
		if err != nil || ex.ExitCode != 1 || !strings.Contains(string(ex.Stderr), "no such file") {
			t.Errorf("ExecSync of a failing command in container %d: %v, exit %d, stderr %q; want exit 1", i, err, ex.GetExitCode(), ex.GetStderr())
		}
	}
	// The containers' output reaches their CRI logs.
	for _, name := range []string{"tick-a", "tick-b"} {
		path := filepath.Join(logDir, name+".log")
		deadline := time.Now().Add(20 * time.Second)
		for {
			b, _ := os.ReadFile(path)
			if strings.Contains(string(b), " stdout F tick=") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("CRI log %s has no tick line: %q", path, b)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	for i, id := range ids {
		if _, err := n.rt.StopContainer(ctx, &runtime.StopContainerRequest{ContainerId: id, Timeout: 10}); err != nil {
			t.Fatalf("StopContainer %d: %v", i, err)
		}
		st, err := n.rt.ContainerStatus(ctx, &runtime.ContainerStatusRequest{ContainerId: id})
		if err != nil || st.Status.State != runtime.ContainerState_CONTAINER_EXITED {
			t.Errorf("ContainerStatus %d after stop: %v, %v; want exited", i, st, err)
		}
		if _, err := n.rt.RemoveContainer(ctx, &runtime.RemoveContainerRequest{ContainerId: id}); err != nil {
			t.Fatalf("RemoveContainer %d: %v", i, err)
		}
	}
	if _, err := n.rt.StopPodSandbox(ctx, &runtime.StopPodSandboxRequest{PodSandboxId: podID}); err != nil {
		t.Fatalf("StopPodSandbox: %v", err)
	}
	if _, err := n.rt.RemovePodSandbox(ctx, &runtime.RemovePodSandboxRequest{PodSandboxId: podID}); err != nil {
		t.Fatalf("RemovePodSandbox: %v", err)
	}
	pods, err := n.rt.ListPodSandbox(ctx, &runtime.ListPodSandboxRequest{})
	if err != nil || len(pods.Items) != 0 {
		t.Errorf("ListPodSandbox after removal: %v, %v; want none", pods, err)
	}
	if list, _ := n.c.RunscIn(binary(t, "runsc"), "k8s.io").Exec("list", "-quiet"); strings.TrimSpace(list) != "" {
		t.Errorf("runsc still lists containers after the pod was removed: %q", list)
	}
}

func hasImage(imgs []*runtime.Image, ref string) bool {
	for _, img := range imgs {
		for _, tag := range img.RepoTags {
			if tag == ref {
				return true
			}
		}
	}
	return false
}
