/*
 * The pod sandbox's process ("pause"): holds the pod's namespaces open and does nothing else.
 * Built statically by dev/image.sh into the image localhost/streamapp/pause, which the test
 * bed's containerd uses as its sandbox_image (the node pulls nothing from a registry).
 *
 * It exits on SIGINT/SIGTERM and reaps any child that is reparented to it (it is PID 1 of
 * the pod when the pod shares its process namespace).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) {
  (void)sig;
  _exit(0);
}

static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(void) {
  if (getpid() != 1) {
    fprintf(stderr, "pause: warning: not running as PID 1\n");
  }
  struct sigaction term = {.sa_handler = stop};
  struct sigaction child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
  if (sigaction(SIGINT, &term, NULL) < 0 || sigaction(SIGTERM, &term, NULL) < 0 ||
      sigaction(SIGCHLD, &child, NULL) < 0) {
    perror("pause: sigaction");
    return 1;
  }
  for (;;) {
    pause();
  }
}
