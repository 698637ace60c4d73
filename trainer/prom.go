package trainer

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are one trainer's Prometheus series (raftps train --metrics-addr
// serves them): steps, examples, the latency of its pulls, pushes and
// allreduces, late steps, and trainer 0's latest evaluation. Every series
// carries the job and the trainer's rank as constant labels.
type Metrics struct {
	steps, examples, late  prometheus.Counter
	pull, push, allreduce  prometheus.Observer
	evalStep, auc, logloss prometheus.Gauge
	bayesAUC, bayesLogLoss prometheus.Gauge
}

// NewMetrics registers a trainer's metrics with reg.
// rank is the trainer's rank, or "assigned" when the job registry
// assigns it.
func NewMetrics(reg prometheus.Registerer, job, rank string) *Metrics {
	labels := prometheus.Labels{"job": job, "rank": rank}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels})
	}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels})
	}
	hist := func(name, help string) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, ConstLabels: labels,
			Buckets: prometheus.ExponentialBuckets(250e-6, 2.5, 12)})
	}
	pull := hist("raftps_trainer_pull_seconds", "Time of one step's pull of its batch's rows.")
	push := hist("raftps_trainer_push_seconds", "Time of one step's push of its row gradients.")
	all := hist("raftps_trainer_allreduce_seconds", "Time of one step's allreduce of the dense gradient (sync jobs with more than one trainer).")
	m := &Metrics{
		steps:        counter("raftps_trainer_steps_total", "Steps this trainer finished."),
		examples:     counter("raftps_trainer_examples_total", "Examples whose gradients this trainer's finished steps used (its rate is examples/s)."),
		late:         counter("raftps_trainer_late_steps_total", "Steps whose gradients came too late to be used (backup workers)."),
		pull:         pull,
		push:         push,
		allreduce:    all,
		evalStep:     gauge("raftps_trainer_eval_step", "The step of trainer 0's latest evaluation."),
		auc:          gauge("raftps_trainer_eval_auc", "AUC of trainer 0's latest evaluation on the held-out set."),
		logloss:      gauge("raftps_trainer_eval_logloss", "Log loss of trainer 0's latest evaluation on the held-out set."),
		bayesAUC:     gauge("raftps_trainer_bayes_auc", "The Bayes-optimal AUC of the held-out set (synthetic data only)."),
		bayesLogLoss: gauge("raftps_trainer_bayes_logloss", "The Bayes-optimal log loss of the held-out set (synthetic data only)."),
	}
	reg.MustRegister(m.steps, m.examples, m.late, pull, push, all, m.evalStep, m.auc, m.logloss, m.bayesAUC, m.bayesLogLoss)
	return m
}

// The methods below do nothing on a nil *Metrics (no --metrics-addr).

func (m *Metrics) pulled(d time.Duration) {
	if m != nil {
		m.pull.Observe(d.Seconds())
	}
}

func (m *Metrics) pushed(d time.Duration) {
	if m != nil {
		m.push.Observe(d.Seconds())
	}
}

func (m *Metrics) allreduced(d time.Duration) {
	if m != nil {
		m.allreduce.Observe(d.Seconds())
	}
}

func (m *Metrics) step(examples int) {
	if m != nil {
		m.steps.Inc()
		m.examples.Add(float64(examples))
	}
}

func (m *Metrics) lateStep() {
	if m != nil {
		m.late.Inc()
	}
}

func (m *Metrics) eval(e Eval) {
	if m == nil {
		return
	}
	m.evalStep.Set(float64(e.Step))
	m.auc.Set(e.AUC)
	m.logloss.Set(e.LogLoss)
	if e.BayesAUC.Known() {
		m.bayesAUC.Set(float64(e.BayesAUC))
		m.bayesLogLoss.Set(float64(e.BayesLogLoss))
	}
}
