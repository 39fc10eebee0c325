# Stage costmodel: the cost model's derived numbers (Eq. 1, Props 3.1/3.2) recomputed from a machine profile's
# published constants (data/profiles/<profile>.yaml) and checked against the paper's.


rule check_costmodel:
    output:
        "results/costmodel/checks-{profile}.json",
    log:
        "results/costmodel/checks-{profile}.log",
    benchmark:
        "results/costmodel/checks-{profile}.benchmark.tsv"
    conda:
        "../../environment.yml"
    wildcard_constraints:
        profile=name_pattern(COSTMODEL_PROFILES),
    shell:
        "ostinato costmodel check --profile {wildcards.profile} --out {output} > {log} 2>&1"
