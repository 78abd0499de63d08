"""Optuna's side of `wtune-bench search`: the same functions, run with
Optuna's samplers, regrets printed as JSON for the bench's table.

Usage: python optuna_suite.py '<json from wtune-bench>'. The input names
each function with its search space and its value at a few configurations;
this script's copy of each function must give those values, or it stops:
both sides must measure the same thing.
"""

import json
import math
import statistics
import sys
import time

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

optuna.logging.set_verbosity(optuna.logging.ERROR)


def xs(c, n):
    return [c[f"x{i}"] for i in range(n)]


def branin(c):
    x, y = c["x0"], c["x1"]
    b, cc, t = 5.1 / (4 * math.pi**2), 5 / math.pi, 1 / (8 * math.pi)
    return (y - b * x * x + cc * x - 6) ** 2 + 10 * (1 - t) * math.cos(x) + 10 - 0.3978873577297382


def rotated(c):
    x = xs(c, 4)
    return (10 * (x[0] + x[1] - 1) ** 2 + 0.5 * (x[0] - x[1]) ** 2
            + 10 * (x[2] + x[3]) ** 2 + 0.5 * (x[2] - x[3] - 2) ** 2)


H_A = [[10, 3, 17, 3.5, 1.7, 8], [0.05, 10, 17, 0.1, 8, 14],
       [3, 3.5, 1.7, 10, 17, 8], [17, 8, 0.05, 10, 0.1, 14]]
H_P = [[0.1312, 0.1696, 0.5569, 0.0124, 0.8283, 0.5886],
       [0.2329, 0.4135, 0.8307, 0.3736, 0.1004, 0.9991],
       [0.2348, 0.1451, 0.3522, 0.2883, 0.3047, 0.6650],
       [0.4047, 0.8828, 0.8732, 0.5743, 0.1091, 0.0381]]
H_ALPHA = [1.0, 1.2, 3.0, 3.2]


def hartmann6(c):
    x = xs(c, 6)
    s = sum(H_ALPHA[i] * math.exp(-sum(H_A[i][j] * (x[j] - H_P[i][j]) ** 2 for j in range(6)))
            for i in range(4))
    return 3.322368011415515 - s


def rosenbrock(c):
    x = xs(c, 8)
    return sum(100 * (x[i + 1] - x[i] ** 2) ** 2 + (1 - x[i]) ** 2 for i in range(7))


def ackley(c):
    x = xs(c, 10)
    n = len(x)
    sq = sum(v * v for v in x) / n
    co = sum(math.cos(2 * math.pi * v) for v in x) / n
    return -20 * math.exp(-0.2 * math.sqrt(sq)) - math.exp(co) + 20 + math.e


def shifted_sphere(c):
    return sum((v - math.sin(i * 0.37) * 3) ** 2 for i, v in enumerate(xs(c, 20)))


def mixed(c):
    act = {"gelu": 0.0, "relu": 0.5}.get(c["act"], 1.0)
    return (math.log10(c["lr"]) + 3 + 0.1 * (c["layers"] - 4)) ** 2 + act + (c["dropout"] - 0.3) ** 2


def categorical(c):
    def pick(key, best):
        return 0.0 if c[key] == best else 1.0
    return (pick("a", "p") + pick("b", "q") * 0.8 + pick("c", "r") * 0.6 + pick("d", "s") * 0.4
            + (c["u"] - 0.25) ** 2 + (c["v"] - 0.75) ** 2)


FUNCTIONS = {
    "branin (2-d)": branin,
    "rotated quadratic (4-d)": rotated,
    "mixed: log, int, choice, float (4-d)": mixed,
    "hartmann-6 (6-d)": hartmann6,
    "categorical + 2 floats (6-d)": categorical,
    "rosenbrock (8-d)": rosenbrock,
    "ackley (10-d)": ackley,
    "shifted sphere (20-d)": shifted_sphere,
}

SAMPLERS = {
    "optuna TPESampler (default)": lambda seed: optuna.samplers.TPESampler(seed=seed),
    "optuna TPESampler(multivariate=False)":
        lambda seed: optuna.samplers.TPESampler(seed=seed, multivariate=False),
}


# Optuna's GP-based sampler, on the functions the caller lists (it needs
# PyTorch and SciPy, which the bench installs only when asked).
GP_SAMPLER = ("optuna GPSampler", lambda seed: optuna.samplers.GPSampler(seed=seed))


def distributions(space):
    """wtune's param_space domains as Optuna distributions."""
    out = {}
    for name, domain in space.items():
        (kind, args), = domain.items()
        if kind == "uniform":
            out[name] = FloatDistribution(args[0], args[1])
        elif kind == "loguniform":
            out[name] = FloatDistribution(args[0], args[1], log=True)
        elif kind == "randint":
            out[name] = IntDistribution(args[0], args[1] - 1)
        elif kind == "choice":
            out[name] = CategoricalDistribution(args)
        else:
            sys.exit(f"{name}: domain {kind} is not mapped")
    return out


def regrets(f, dists, sampler, trials, at):
    study = optuna.create_study(sampler=sampler)
    best, out = math.inf, []
    for i in range(trials):
        trial = study.ask(dists)
        value = f(trial.params)
        study.tell(trial, value)
        best = min(best, value)
        if i + 1 in at:
            out.append(max(best, 0.0))
    return out


def suggestion_ms(make, f, dists, observations):
    """Median ms of 5 asks after `observations` random completed trials."""
    study = optuna.create_study(sampler=make(1))
    filler = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(observations):
        t = filler.ask(dists)
        study.add_trial(optuna.trial.create_trial(params=t.params, distributions=dists,
                                                  value=f(t.params)))
    times = []
    for _ in range(5):
        began = time.perf_counter()
        trial = study.ask(dists)
        times.append((time.perf_counter() - began) * 1e3)
        study.tell(trial, f(trial.params))
    return statistics.median(times)


def main():
    spec = json.loads(sys.argv[1])
    rows = {}
    for fn in spec["functions"]:
        name = fn["name"]
        f = FUNCTIONS.get(name)
        if f is None:
            sys.exit(f"no Python copy of the function {name!r}")
        for point in fn["points"]:
            got, want = f(point["config"]), point["value"]
            if not math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12):
                sys.exit(f"{name}: {got} here, {want} in wtune-bench at {point['config']}")
        dists = distributions(fn["space"])
        samplers = list(SAMPLERS.items())
        if name in spec.get("gp_functions", []):
            samplers.append(GP_SAMPLER)
        rows[name] = [
            {"sampler": label,
             "regrets": [regrets(f, dists, make(seed), spec["trials"], spec["at"])
                         for seed in range(spec["seeds"])]}
            for label, make in samplers
        ]
    # Suggestion times on hartmann-6, when it was selected.
    h6 = next((fn for fn in spec["functions"] if fn["name"] == "hartmann-6 (6-d)"), None)
    if h6 is None:
        json.dump({"optuna": optuna.__version__, "rows": rows, "times": []}, sys.stdout)
        return
    dists = distributions(h6["space"])
    times = [
        {"sampler": label,
         "at_100": suggestion_ms(make, hartmann6, dists, 100),
         "at_200": suggestion_ms(make, hartmann6, dists, 200),
         "at_1000": suggestion_ms(make, hartmann6, dists, 1000)}
        for label, make in SAMPLERS.items()
    ]
    if "hartmann-6 (6-d)" in spec.get("gp_functions", []):
        label, make = GP_SAMPLER
        times.append({"sampler": label,
                      "at_100": suggestion_ms(make, hartmann6, dists, 100),
                      "at_200": suggestion_ms(make, hartmann6, dists, 200)})
    json.dump({"optuna": optuna.__version__, "rows": rows, "times": times}, sys.stdout)


if __name__ == "__main__":
    main()
