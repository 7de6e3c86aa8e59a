"""`lj_relax`: relax a Lennard-Jones cluster to a local energy minimum.

Reduced units (epsilon = sigma = 1). The starting geometry is a random packing in a sphere
(seeded); the optimiser is FIRE (Bitzek et al., PRL 97, 170201 (2006)) with ASE's defaults.
Each step reports its energy as progress and as a log line; the trajectory is written as a
multi-frame XYZ artifact; the result holds the final energy and the number of steps.
Pure Python on purpose: it runs in any image that has python3.
"""

from __future__ import annotations

import math
import random
import sys
import time

from controlplane_runner import toolkit


def energy_forces(pos: list[list[float]]) -> tuple[float, list[list[float]]]:
    n = len(pos)
    e = 0.0
    f = [[0.0, 0.0, 0.0] for _ in range(n)]
    for i in range(n):
        xi, yi, zi = pos[i]
        fi = f[i]
        for j in range(i + 1, n):
            dx = xi - pos[j][0]
            dy = yi - pos[j][1]
            dz = zi - pos[j][2]
            r2 = dx * dx + dy * dy + dz * dz
            ir2 = 1.0 / r2
            ir6 = ir2 * ir2 * ir2
            e += 4.0 * ir6 * (ir6 - 1.0)
            s = 24.0 * ir2 * ir6 * (2.0 * ir6 - 1.0)  # -dE/dr / r
            fx, fy, fz = s * dx, s * dy, s * dz
            fi[0] += fx
            fi[1] += fy
            fi[2] += fz
            fj = f[j]
            fj[0] -= fx
            fj[1] -= fy
            fj[2] -= fz
    return e, f


def initial_positions(n: int, seed: int) -> list[list[float]]:
    rng = random.Random(seed)
    radius = (3.0 * n / (4.0 * math.pi * 0.7)) ** (1.0 / 3.0)
    pos: list[list[float]] = []
    while len(pos) < n:
        p = [rng.uniform(-radius, radius) for _ in range(3)]
        if sum(c * c for c in p) > radius * radius:
            continue
        if all(sum((a - b) ** 2 for a, b in zip(p, q, strict=True)) > 0.81 for q in pos):
            pos.append(p)
    return pos


def norm(v: list[list[float]]) -> float:
    return math.sqrt(sum(c * c for row in v for c in row))


def write_frame(out, pos: list[list[float]], step: int, energy: float) -> None:
    out.write(f"{len(pos)}\nstep={step} energy={energy:.8f}\n")
    for x, y, z in pos:
        out.write(f"Ar {x:.6f} {y:.6f} {z:.6f}\n")


def relax(n_atoms: int, fmax: float, max_steps: int, seed: int) -> dict:
    pos = initial_positions(n_atoms, seed)
    vel = [[0.0, 0.0, 0.0] for _ in range(n_atoms)]
    dt, dtmax, maxstep = 0.01, 0.1, 0.1
    nmin, finc, fdec, astart, fa = 5, 1.1, 0.5, 0.1, 0.99
    a, n_pos = astart, 0
    traj_path = toolkit.artifact("trajectory.xyz", kind="trajectory", content_type="chemical/x-xyz")
    t0 = time.monotonic()
    with open(traj_path, "w") as traj:
        energy, forces = energy_forces(pos)
        step = 0
        f0 = None
        done = 0.0
        while True:
            fm = max(math.sqrt(sum(c * c for c in row)) for row in forces)
            if step % 10 == 0:
                write_frame(traj, pos, step, energy)
            print(f"step={step} energy={energy:.6f} fmax={fm:.6f}")
            # Progress toward convergence: how far the largest force has come down, on a log scale.
            f0 = f0 or max(fm, fmax * 10)
            done = max(done, min(99.9, 100 * math.log(f0 / max(fm, fmax)) / math.log(f0 / fmax)))
            elapsed = time.monotonic() - t0
            eta = elapsed * (100 - done) / done if done > 1 else None
            toolkit.progress(round(done, 2), step=step, step_total=max_steps, phase="relax",
                             message=f"E={energy:.6f} fmax={fm:.2e}", eta_s=round(eta, 2) if eta else None)
            if fm < fmax or step >= max_steps:
                break
            # FIRE step
            vf = sum(v * f for vr, fr in zip(vel, forces, strict=True) for v, f in zip(vr, fr, strict=True))
            if vf > 0.0:
                vn, fn = norm(vel), norm(forces)
                mix = a * vn / fn if fn else 0.0
                vel = [[(1 - a) * v + mix * f for v, f in zip(vr, fr, strict=True)] for vr, fr in zip(vel, forces, strict=True)]
                if n_pos > nmin:
                    dt = min(dt * finc, dtmax)
                    a *= fa
                n_pos += 1
            else:
                vel = [[0.0, 0.0, 0.0] for _ in range(n_atoms)]
                a, dt, n_pos = astart, dt * fdec, 0
            vel = [[v + dt * f for v, f in zip(vr, fr, strict=True)] for vr, fr in zip(vel, forces, strict=True)]
            dr = [[dt * v for v in vr] for vr in vel]
            step_len = norm(dr)
            if step_len > maxstep:
                dr = [[c * maxstep / step_len for c in row] for row in dr]
            pos = [[p + d for p, d in zip(pr, drr, strict=True)] for pr, drr in zip(pos, dr, strict=True)]
            energy, forces = energy_forces(pos)
            step += 1
        write_frame(traj, pos, step, energy)
    converged = fm < fmax
    toolkit.progress(100.0, step=step, step_total=max_steps, phase="done",
                     message=f"{'converged' if converged else 'stopped at max_steps'}: E={energy:.6f}", eta_s=0)
    return {
        "energy": round(energy, 8),
        "energy_per_atom": round(energy / n_atoms, 8),
        "n_steps": step,
        "converged": converged,
        "final_fmax": fm,
        "n_atoms": n_atoms,
    }


def main() -> int:
    inp = toolkit.inputs()
    res = relax(int(inp.get("n_atoms", 38)), float(inp.get("fmax", 1e-3)),
                int(inp.get("max_steps", 2000)), int(inp.get("seed", 0)))
    toolkit.result(res)
    print(f"final energy={res['energy']:.6f} after {res['n_steps']} steps (converged={res['converged']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
