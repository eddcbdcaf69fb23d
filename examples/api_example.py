"""Train a small PBT population, then use its best member."""

import gymnasium as gym

import fastpbrl

SETTINGS = {'env': 'Pendulum-v1', 'population_size': 4, 'env_steps': 20_000,
            'progress': False}


class PrintCopies(fastpbrl.Callback):
  """Prints every PBT copy as it happens."""

  def after_rule_decision(self, loop, event):
    if event['event'] == 'exploit':
      print(f"{event['env_steps']} env steps: member {event['member']} "
            f"copied member {event['parent']}")


def main(**overrides):
  result = fastpbrl.train('pbt', callbacks=[PrintCopies()],
                          **{**SETTINGS, **overrides})
  print(f'best member {result.best_member} '
        f'({result.best_final_return:.1f}), checkpoint {result.checkpoint}, '
        f'{len(result.lineage)} lineage events')

  policy = fastpbrl.load_policy(result.run_dir)  # member='best'
  env = gym.make('Pendulum-v1')
  observation, _ = env.reset(seed=0)
  print('action', policy(observation))  # numpy in, numpy out

  scores = fastpbrl.evaluate(result.run_dir, episodes=5)
  print(f'member {scores.member}: {scores.mean:.1f} +- {scores.std:.1f}')
  return result, scores


if __name__ == '__main__':  # required: actor processes re-import this file
  main()
