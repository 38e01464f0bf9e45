set terminal pngcairo size 1200,500 noenhanced
set output 'bench/results/policy_sweep/loss_curves.png'
set datafile separator ','
set key autotitle columnhead
set multiplot layout 1,2
set title 'training loss'
set xlabel 'step'
set ylabel 'loss'
set logscale y
plot 'bench/results/policy_sweep/loss_curves.csv' using 1:2 with lines lw 2, 'bench/results/policy_sweep/loss_curves.csv' using 1:5 with lines lw 2, 'bench/results/policy_sweep/loss_curves.csv' using 1:8 with lines lw 2, 'bench/results/policy_sweep/loss_curves.csv' using 1:11 with lines lw 2
set title 'loss scale'
set ylabel 'scale'
plot 'bench/results/policy_sweep/loss_curves.csv' using 1:3 with lines lw 2, 'bench/results/policy_sweep/loss_curves.csv' using 1:6 with lines lw 2, 'bench/results/policy_sweep/loss_curves.csv' using 1:9 with lines lw 2, 'bench/results/policy_sweep/loss_curves.csv' using 1:12 with lines lw 2
unset multiplot
