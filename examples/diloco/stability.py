#!/usr/bin/python3
"""Why DiLoCo's outer step is taken before the epidemic average, not after:
the consensus error e = θ_outer_1 − θ_outer_2 of two workers that each
average with the other's model of d outer steps before, under the two
designs (gradients left out: this is the loop the exchange closes).

  pull in momentum (the earlier design): each worker averages first and
      takes g = θ_outer − the average as Nesterov's gradient, so
      g_1 − g_2 = (e_t + e_{t−d})/2 goes through the momentum b at lr:
      b ← μb + g, e ← e − lr·(g + μb)
  local step, then average (the design now): e ← (e_t − e_{t−d})/2

It prints the spectral radius of each recurrence (> 1: the workers'
models move apart) and the largest stable outer rate of the first.

    /usr/bin/python3 examples/diloco/stability.py
"""

import numpy as np


def radius_momentum(lr, mu, d):
    n = d + 2  # state: e_t, e_{t-1}, ..., e_{t-d}, b
    g = np.zeros(n)
    g[0] += 0.5
    g[d] += 0.5
    b = mu * np.eye(n)[n - 1] + g
    a = np.zeros((n, n))
    a[n - 1] = b
    a[0] = np.eye(n)[0] - lr * (g + mu * b)
    for k in range(1, d + 1):
        a[k, k - 1] = 1
    return max(abs(np.linalg.eigvals(a)))


def radius_average(d):
    if d == 0:
        return 0.0  # both average the same two models: e = 0 after one round
    a = np.zeros((d + 1, d + 1))
    a[0, 0], a[0, d] = 0.5, -0.5
    for k in range(1, d + 1):
        a[k, k - 1] = 1
    return max(abs(np.linalg.eigvals(a)))


def main():
    lr, mu = 0.7, 0.9
    print(f"outer Nesterov lr {lr}, momentum {mu}; a peer's model d outer steps stale")
    print("d  pull-in-momentum radius  largest stable lr  local-step-then-average radius")
    for d in range(4):
        stable = [x for x in np.arange(0.01, 3.0, 0.01) if radius_momentum(x, mu, d) < 1]
        print(f"{d}  {radius_momentum(lr, mu, d):23.3f}  {max(stable):17.2f}  {radius_average(d):30.3f}")


if __name__ == "__main__":
    main()
