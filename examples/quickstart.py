"""PBT on Pendulum-v1, then the best member's policy, score and schedule."""
import fastpbrl


def main(**settings):
  result = fastpbrl.train('pbt', env='Pendulum-v1', **settings)
  policy = fastpbrl.load_policy(result.run_dir)  # the best member: policy(obs)
  scores = fastpbrl.evaluate(result.run_dir, episodes=10)
  run = fastpbrl.load_run(result.run_dir)  # pandas tables of the run
  print(scores.mean, run.hparam_schedule(), sep='\n')  # its hparams over time
  return policy, scores, run


if __name__ == '__main__':  # required: actor processes re-import this file
  main()
